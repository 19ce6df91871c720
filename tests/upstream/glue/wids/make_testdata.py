"""Write the shards wids' tests read from ``testdata/``, which the wids sdist does not ship.

Written for sharedfs's tests/upstream/run.py from what the tests assert about each file (sample
counts, keys, extensions, one text value); the bytes are ours, so the one test that checks an
md5 of upstream's own ixtest.tar is deselected (deselect.txt).  Usage: make_testdata.py DIR
(writes DIR/testdata/*.tar; deterministic, so both modes read identical files).
"""

from __future__ import annotations

import gzip
import io
import sys
import tarfile
from pathlib import Path

import msgpack


def _tar(path: Path, samples) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for key, members in samples:
            for extension, payload in members.items():
                info = tarfile.TarInfo(f"{key}{extension}")
                info.size = len(payload)
                info.mtime = 1_700_000_000  # fixed: identical bytes on every run
                archive.addfile(info, io.BytesIO(payload))


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def main(root: str) -> None:
    out = Path(root) / "testdata"
    out.mkdir(parents=True, exist_ok=True)
    # 10 samples with a class label (TestLRUShards, TestIndexedTarSamples)
    _tar(out / "ixtest.tar", [(f"{i:06d}", {".cls": str(i % 3).encode(), ".txt": f"sample {i}".encode()})
                              for i in range(10)])
    # 100 msgpack samples and 100 ".ten" samples, keys 000000..000099 (TestShardListDataset)
    _tar(out / "mpdata.tar", [(f"{i:06d}", {".mp": msgpack.packb({"index": i, "values": [i, i + 1]})})
                              for i in range(100)])
    _tar(out / "tendata.tar", [(f"{i:06d}", {".ten": bytes(range(10)) * 4}) for i in range(100)])
    # 3 samples under a directory, gzip-compressed text (keys compressed/0001..0003)
    _tar(out / "compressed.tar", [(f"compressed/{i:04d}", {".txt.gz": _gz(f"compressed text {i}".encode())})
                                  for i in range(1, 4)])
    # 1000 gzip-compressed texts; the test reads sample 0's value back
    _tar(out / "testgz.tar", [(f"{i:06d}", {".txt.gz": _gz(b", or more info on the item." if i == 0 else
                                                          f"line {i}".encode())}) for i in range(1000)])


if __name__ == "__main__":
    main(sys.argv[1])
