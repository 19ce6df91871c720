/*
 * LD_PRELOAD fault library for sharedfs tests: file locks fail on chosen paths.
 *
 * Cluster filesystems refuse locks outright: Lustre mounted without
 * "-o flock" answers ENOSYS, NFS without a lock daemon ENOLCK.  This library
 * reproduces that on any local directory, without FUSE:
 *
 *   SHAREDFS_FAULT_PREFIXES  colon-separated directories; a lock call on an
 *                            fd whose path (readlink /proc/self/fd/N) is one
 *                            of them or lies below one fails
 *   SHAREDFS_FAULT_ERRNO     ENOSYS (default), ENOLCK, EOPNOTSUPP, EINVAL,
 *                            EIO, EACCES, EAGAIN, ESTALE or a decimal errno
 *                            number
 *   SHAREDFS_FAULT_ONLY      "unlock": only releases fail (flock LOCK_UN,
 *                            lockf F_ULOCK, fcntl F_UNLCK), as NFS answers
 *                            ENOLCK or ESTALE to an unlock when many clients
 *                            start at once; unset: every lock call fails
 *
 * Interposed: flock, lockf, lockf64, and fcntl/fcntl64 for the lock commands
 * F_GETLK/F_SETLK/F_SETLKW (and their 64-bit and F_OFD_* variants).  Every
 * other call goes to the real libc function found with dlsym(RTLD_NEXT).
 * Both variables are read on every call, so a process can change them.
 *
 * Build: gcc -shared -fPIC -O2 -o lib.so preload.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/types.h>
#include <unistd.h>

typedef int (*fcntl_fn)(int, int, ...);
typedef int (*flock_fn)(int, int);
typedef int (*lockf_fn)(int, int, off_t);
typedef int (*lockf64_fn)(int, int, off64_t);

/* The real function; falls back to another name for older glibc (fcntl64
 * only exists since 2.28).  Racing first calls store the same pointer. */
static void *real_symbol(const char *name, const char *fallback)
{
    void *sym = dlsym(RTLD_NEXT, name);
    if (!sym && fallback)
        sym = dlsym(RTLD_NEXT, fallback);
    return sym;
}

static int fault_errno(void)
{
    static const struct { const char *name; int value; } names[] = {
        {"ENOSYS", ENOSYS}, {"ENOLCK", ENOLCK}, {"EOPNOTSUPP", EOPNOTSUPP},
        {"ENOTSUP", ENOTSUP}, {"EINVAL", EINVAL}, {"EIO", EIO},
        {"EACCES", EACCES}, {"EAGAIN", EAGAIN}, {"EPERM", EPERM},
        {"ESTALE", ESTALE},
    };
    const char *value = getenv("SHAREDFS_FAULT_ERRNO");
    if (!value || !*value)
        return ENOSYS;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(value, names[i].name) == 0)
            return names[i].value;
    char *end;
    long number = strtol(value, &end, 10);
    return (*end == '\0' && number > 0) ? (int)number : ENOSYS;
}

/* Does `path` equal the directory `prefix` (of length len) or lie below it?
 * Component-wise, so "/mnt/a" does not match "/mnt/ab/f". */
static int under_prefix(const char *path, const char *prefix, size_t len)
{
    while (len > 1 && prefix[len - 1] == '/')
        len--;
    if (len == 1 && prefix[0] == '/')
        return path[0] == '/';
    return strncmp(path, prefix, len) == 0 && (path[len] == '\0' || path[len] == '/');
}

static int should_fail(int fd)
{
    const char *list = getenv("SHAREDFS_FAULT_PREFIXES");
    if (!list || !*list || fd < 0)
        return 0;
    char link[64];
    char path[PATH_MAX];
    int saved = errno; /* readlink may fail; the caller's errno must not change */
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    errno = saved;
    if (n <= 0)
        return 0;
    path[n] = '\0';
    for (const char *p = list; *p;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len && under_prefix(path, p, len))
            return 1;
        if (!colon)
            break;
        p = colon + 1;
    }
    return 0;
}

/* With SHAREDFS_FAULT_ONLY=unlock, only a release fails. */
static int unlock_only(void)
{
    const char *only = getenv("SHAREDFS_FAULT_ONLY");
    return only && strcmp(only, "unlock") == 0;
}

static int is_lock_cmd(int cmd)
{
    switch (cmd) {
    case F_GETLK:
    case F_SETLK:
    case F_SETLKW:
#if defined(F_GETLK64) && F_GETLK64 != F_GETLK
    case F_GETLK64:
    case F_SETLK64:
    case F_SETLKW64:
#endif
#ifdef F_OFD_GETLK
    case F_OFD_GETLK:
    case F_OFD_SETLK:
    case F_OFD_SETLKW:
#endif
        return 1;
    default:
        return 0;
    }
}

static int fail(void)
{
    errno = fault_errno();
    return -1;
}

int flock(int fd, int operation)
{
    static flock_fn real;
    if ((!unlock_only() || (operation & LOCK_UN)) && should_fail(fd))
        return fail();
    if (!real)
        real = (flock_fn)real_symbol("flock", NULL);
    return real(fd, operation);
}

/* fcntl's third argument is absent, an int or a pointer depending on cmd.
 * Like glibc itself, fetch one pointer-sized word and hand it on unchanged:
 * on the supported ABIs (x86_64, aarch64) that passes every form through. */
static void *third_arg(va_list ap)
{
    return va_arg(ap, void *);
}

/* A set-lock command whose struct flock asks to unlock. */
static int releases(int cmd, void *arg)
{
    if (cmd == F_GETLK || !arg)
        return 0;
#ifdef F_OFD_GETLK
    if (cmd == F_OFD_GETLK)
        return 0;
#endif
    return ((struct flock *)arg)->l_type == F_UNLCK;
}

int fcntl(int fd, int cmd, ...)
{
    static fcntl_fn real;
    va_list ap;
    va_start(ap, cmd);
    void *arg = third_arg(ap);
    va_end(ap);
    if (is_lock_cmd(cmd) && (!unlock_only() || releases(cmd, arg)) && should_fail(fd))
        return fail();
    if (!real)
        real = (fcntl_fn)real_symbol("fcntl", NULL);
    return real(fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...)
{
    static fcntl_fn real;
    va_list ap;
    va_start(ap, cmd);
    void *arg = third_arg(ap);
    va_end(ap);
    if (is_lock_cmd(cmd) && (!unlock_only() || releases(cmd, arg)) && should_fail(fd))
        return fail();
    if (!real)
        real = (fcntl_fn)real_symbol("fcntl64", "fcntl");
    return real(fd, cmd, arg);
}

/* libc's lockf calls its internal fcntl directly, past our fcntl, so lockf
 * needs its own interposer (Python's os.lockf uses it). */
int lockf(int fd, int cmd, off_t len)
{
    static lockf_fn real;
    if ((!unlock_only() || cmd == F_ULOCK) && should_fail(fd))
        return fail();
    if (!real)
        real = (lockf_fn)real_symbol("lockf", NULL);
    return real(fd, cmd, len);
}

int lockf64(int fd, int cmd, off64_t len)
{
    static lockf64_fn real;
    if ((!unlock_only() || cmd == F_ULOCK) && should_fail(fd))
        return fail();
    if (!real)
        real = (lockf64_fn)real_symbol("lockf64", "lockf");
    return real(fd, cmd, len);
}
