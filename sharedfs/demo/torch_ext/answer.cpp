// The smallest extension torch.utils.cpp_extension.load() builds: a Python module with one function.
// It includes Python.h only (not torch/extension.h, whose headers take ~30 s to compile), so a test
// build takes well under a second and the tests measure locking, not the compiler.
// load() defines TORCH_EXTENSION_NAME (name, or name_v<N> after a source change) on the command line.
#include <Python.h>

#define SFS_CONCAT2(a, b) a##b
#define SFS_CONCAT(a, b) SFS_CONCAT2(a, b)
#define SFS_STRING2(x) #x
#define SFS_STRING(x) SFS_STRING2(x)

static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }

static PyMethodDef methods[] = {
    {"answer", answer, METH_NOARGS, "Return 42."},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, SFS_STRING(TORCH_EXTENSION_NAME), nullptr, -1, methods};

PyMODINIT_FUNC SFS_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
