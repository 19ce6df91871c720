"""pytest glue for datasets' own tests, written for sharedfs's tests/upstream/run.py.

The datasets sdist ships ``tests/test_*.py`` but not ``tests/conftest.py``, ``tests/utils.py``
or ``tests/fixtures/``.  This file provides what the selected modules need, from how the tests
use each name:

* the suite's settings: caches in pytest's temp dir (never ~/.cache), no implicit token, no
  progress bars, no download counting; tests not marked ``integration`` get the ``unit`` marker
  (run.py deselects ``integration``: those talk to the Hub);
* the session-scoped data files the tests take as fixtures (csv/json/jsonl/parquet/arrow/text
  files, compressed variants and archives, all with the same four-row table);
* ``mockfs``/``tmpfs``: fsspec filesystems under ``mock://`` and ``tmp://`` backed by a local dir;
* a test that asks for a fixture nobody provides (media files under tests/features/data, Hub
  repos) is skipped, naming the fixture, instead of erroring at setup.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import os
import posixpath
import sqlite3
import tarfile
import zipfile
from pathlib import Path
from unittest.mock import patch

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem, stringify_path
from fsspec.registry import _registry as fsspec_registry
from fsspec.spec import AbstractFileSystem

import datasets
import datasets.config

# -- the suite's settings ----------------------------------------------------------------------


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" not in item.keywords and "unit" not in item.keywords:
            item.add_marker(pytest.mark.unit)
        known = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", None)
        if known is None:
            continue
        missing = sorted(n for n in item.fixturenames if n not in known and n != "request")
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"upstream fixture not in the sdist: {', '.join(missing)}"))


@pytest.fixture(autouse=True)
def _datasets_test_config(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.getbasetemp() / "cache" / "datasets"
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr("datasets.config.DOWNLOADED_DATASETS_PATH", str(cache / "downloads"))
    monkeypatch.setattr("datasets.config.EXTRACTED_DATASETS_PATH", str(cache / "downloads" / "extracted"))
    monkeypatch.setattr("datasets.config.HF_UPDATE_DOWNLOAD_COUNTS", False, raising=False)
    monkeypatch.setattr("datasets.config.SAVE_ORIGINAL_SHARD_LENGTHS", True, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_IMPLICIT_TOKEN", True)


@pytest.fixture(autouse=True, scope="session")
def _quiet_and_no_remote_code_wait():
    datasets.disable_progress_bar()
    if hasattr(datasets.config, "TIME_OUT_REMOTE_CODE"):
        datasets.config.TIME_OUT_REMOTE_CODE = 0


@pytest.fixture
def set_sqlalchemy_silence_uber_warning(monkeypatch):
    try:
        import sqlalchemy.util.deprecations as deprecations
    except ImportError:  # not installed: the SQL tests skip themselves
        return
    monkeypatch.setattr(deprecations, "SILENCE_UBER_WARNING", True, raising=False)


# -- data files --------------------------------------------------------------------------------

COLUMNS = ["col_1", "col_2", "col_3"]
ROWS = [{"col_1": str(i), "col_2": i, "col_3": float(i)} for i in range(4)]
ROWS_312 = [{"col_3": float(i), "col_1": str(i), "col_2": i} for i in range(2)]
ROWS_STR = [{"col_1": f"s{i}", "col_2": i, "col_3": float(i)} for i in range(4)]
ROWS_MISSING_FIELDS = [{"col_1": 1, "col_2": 2}, {"col_1": 1, "col_3": 3}]
ROWS_MIXED_TYPES = [
    {"col_1": 1, "col_2": {"a": "a"}, "col_3": [{"x": "x"}]},
    {"col_1": "one", "col_2": {"b": "b"}, "col_3": [{"y": "y"}]},
    {"col_1": None, "col_2": None, "col_3": [None]},
]
COLUMNS_DICT = {c: [row[c] for row in ROWS] for c in COLUMNS}
TEXT_LINES = ["0", "1", "2", "3"]
FILE_CONTENT = "    Text data.\n    Second line of data."


def _new(factory, name: str) -> Path:
    return factory.mktemp("data") / name


def _jsonl(factory, name, rows):
    path = _new(factory, name)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _csv(factory, name):
    path = _new(factory, name)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(ROWS)
    return str(path)


def _text(factory, name, lines=TEXT_LINES):
    path = _new(factory, name)
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def _zip(factory, name, members):
    path = _new(factory, name)
    with zipfile.ZipFile(path, "w") as archive:
        for source, arcname in members:
            archive.write(source, arcname=arcname)
    return path


def _tar(factory, name, members):
    path = _new(factory, name)
    with tarfile.TarFile(path, "w") as archive:
        for source, arcname in members:
            archive.add(source, arcname=arcname)
    return path


def _compress(factory, name, data: bytes, opener):
    path = _new(factory, name)
    with opener(path, "wb") as handle:
        handle.write(data)
    return path


def _arrow(factory, name, columns):
    path = str(_new(factory, name))
    datasets.Dataset.from_dict(columns).map(cache_file_name=path)
    return path


@pytest.fixture(scope="session")
def dataset():
    n = 10
    features = datasets.Features(
        {
            "tokens": datasets.List(datasets.Value("string")),
            "labels": datasets.List(datasets.ClassLabel(names=["negative", "positive"])),
            "answers": {
                "text": datasets.List(datasets.Value("string")),
                "answer_start": datasets.List(datasets.Value("int32")),
            },
            "id": datasets.Value("int64"),
        }
    )
    columns = {
        "tokens": [["foo"] * 5] * n,
        "labels": [[1] * 5] * n,
        "answers": [{"answer_start": [97], "text": ["1976"]}] * n,
        "id": list(range(n)),
    }
    return datasets.Dataset.from_dict(columns, features=features)


@pytest.fixture(scope="session")
def arrow_file(tmp_path_factory, dataset):
    path = str(_new(tmp_path_factory, "file.arrow"))
    dataset.map(cache_file_name=path)
    return path


@pytest.fixture(scope="session")
def dataset_dict():
    return COLUMNS_DICT


@pytest.fixture(scope="session")
def arrow_path(tmp_path_factory):
    return _arrow(tmp_path_factory, "dataset.arrow", COLUMNS_DICT)


@pytest.fixture(scope="session")
def text_file_content():
    return FILE_CONTENT


@pytest.fixture(scope="session")
def text_file(tmp_path_factory):
    path = _new(tmp_path_factory, "file.txt")
    path.write_text(FILE_CONTENT)
    return path


@pytest.fixture(scope="session")
def bz2_file(tmp_path_factory):
    return _compress(tmp_path_factory, "file.txt.bz2", FILE_CONTENT.encode(), bz2.open)


@pytest.fixture(scope="session")
def gz_file(tmp_path_factory):
    return _compress(tmp_path_factory, "file.txt.gz", FILE_CONTENT.encode(), gzip.open)


@pytest.fixture(scope="session")
def xz_file(tmp_path_factory):
    return _compress(tmp_path_factory, "file.xz", FILE_CONTENT.encode(), lzma.open)


@pytest.fixture(scope="session")
def zstd_file(tmp_path_factory):
    import zstandard

    return _compress(tmp_path_factory, "file.zstd", FILE_CONTENT.encode(), zstandard.open)


@pytest.fixture(scope="session")
def lz4_file(tmp_path_factory):
    lz4_frame = pytest.importorskip("lz4.frame")
    return _compress(tmp_path_factory, "file.txt.lz4", FILE_CONTENT.encode(), lz4_frame.open)


@pytest.fixture(scope="session")
def seven_zip_file(tmp_path_factory, text_file):
    py7zr = pytest.importorskip("py7zr")
    path = _new(tmp_path_factory, "file.txt.7z")
    with py7zr.SevenZipFile(path, "w") as archive:
        archive.write(text_file, arcname=os.path.basename(text_file))
    return path


@pytest.fixture(scope="session")
def tar_file(tmp_path_factory, text_file):
    return _tar(tmp_path_factory, "file.txt.tar", [(text_file, os.path.basename(text_file))])


@pytest.fixture(scope="session")
def zip_file(tmp_path_factory, text_file):
    return _zip(tmp_path_factory, "file.txt.zip", [(text_file, os.path.basename(text_file))])


@pytest.fixture(scope="session")
def sqlite_path(tmp_path_factory):
    path = str(_new(tmp_path_factory, "dataset.sqlite"))
    connection = sqlite3.connect(path)
    try:
        connection.execute("CREATE TABLE dataset(col_1 text, col_2 int, col_3 real)")
        connection.executemany("INSERT INTO dataset VALUES (?, ?, ?)", [tuple(r.values()) for r in ROWS])
        connection.commit()
    finally:
        connection.close()
    return path


@pytest.fixture(scope="session")
def csv_path(tmp_path_factory):
    return _csv(tmp_path_factory, "dataset.csv")


@pytest.fixture(scope="session")
def csv2_path(tmp_path_factory):
    return _csv(tmp_path_factory, "dataset2.csv")


@pytest.fixture(scope="session")
def bz2_csv_path(csv_path, tmp_path_factory):
    return _compress(tmp_path_factory, "dataset.csv.bz2", Path(csv_path).read_bytes(), bz2.open)


@pytest.fixture(scope="session")
def zip_csv_path(csv_path, csv2_path, tmp_path_factory):
    return _zip(tmp_path_factory, "csv-dataset.zip", [(p, os.path.basename(p)) for p in (csv_path, csv2_path)])


@pytest.fixture(scope="session")
def zip_uppercase_csv_path(csv_path, csv2_path, tmp_path_factory):
    members = [(p, os.path.basename(p).replace(".csv", ".CSV")) for p in (csv_path, csv2_path)]
    return _zip(tmp_path_factory, "dataset.csv.zip", members)


@pytest.fixture(scope="session")
def zip_csv_with_dir_path(csv_path, csv2_path, tmp_path_factory):
    members = [(p, os.path.join("main_dir", os.path.basename(p))) for p in (csv_path, csv2_path)]
    return _zip(tmp_path_factory, "dataset_with_dir.csv.zip", members)


def _parquet(factory, name, row_groups):
    path = str(_new(factory, name))
    schema = pa.schema({"col_1": pa.string(), "col_2": pa.int64(), "col_3": pa.float64()})
    table = pa.Table.from_pydict(COLUMNS_DICT, schema=schema)
    with pq.ParquetWriter(path, schema=schema) as writer:
        for _ in range(row_groups):
            writer.write_table(table)
    return path


@pytest.fixture(scope="session")
def parquet_path(tmp_path_factory):
    return _parquet(tmp_path_factory, "dataset.parquet", 1)


@pytest.fixture(scope="session")
def multi_row_groups_parquet_path(tmp_path_factory):
    return _parquet(tmp_path_factory, "multi_row_groups_dataset.parquet", 4)


@pytest.fixture(scope="session")
def json_list_of_dicts_path(tmp_path_factory):
    path = _new(tmp_path_factory, "dataset.json")
    path.write_text(json.dumps({"data": ROWS}))
    return str(path)


@pytest.fixture(scope="session")
def json_dict_of_lists_path(tmp_path_factory):
    path = _new(tmp_path_factory, "dataset.json")
    path.write_text(json.dumps({"data": COLUMNS_DICT}))
    return str(path)


@pytest.fixture(scope="session")
def jsonl_path(tmp_path_factory):
    return _jsonl(tmp_path_factory, "dataset.jsonl", ROWS)


@pytest.fixture(scope="session")
def jsonl2_path(tmp_path_factory):
    return _jsonl(tmp_path_factory, "dataset2.jsonl", ROWS)


@pytest.fixture(scope="session")
def jsonl_312_path(tmp_path_factory):
    return _jsonl(tmp_path_factory, "dataset_312.jsonl", ROWS_312)


@pytest.fixture(scope="session")
def jsonl_str_path(tmp_path_factory):
    return _jsonl(tmp_path_factory, "dataset-str.jsonl", ROWS_STR)


@pytest.fixture(scope="session")
def jsonl_missing_fields_path(tmp_path_factory):
    return _jsonl(tmp_path_factory, "dataset-missing-fields.jsonl", ROWS_MISSING_FIELDS)


@pytest.fixture(scope="session")
def jsonl_mixed_types_path(tmp_path_factory):
    return _jsonl(tmp_path_factory, "dataset-mixed-types.jsonl", ROWS_MIXED_TYPES)


@pytest.fixture(scope="session")
def text_gz_path(tmp_path_factory, text_path):
    return str(_compress(tmp_path_factory, "dataset.txt.gz", Path(text_path).read_bytes(), gzip.open))


@pytest.fixture(scope="session")
def jsonl_gz_path(tmp_path_factory, jsonl_path):
    return str(_compress(tmp_path_factory, "dataset.jsonl.gz", Path(jsonl_path).read_bytes(), gzip.open))


@pytest.fixture(scope="session")
def zip_jsonl_path(jsonl_path, jsonl2_path, tmp_path_factory):
    return _zip(tmp_path_factory, "dataset.jsonl.zip", [(p, os.path.basename(p)) for p in (jsonl_path, jsonl2_path)])


@pytest.fixture(scope="session")
def zip_nested_jsonl_path(zip_jsonl_path, tmp_path_factory):
    member = [(zip_jsonl_path, os.path.join("nested", os.path.basename(zip_jsonl_path)))]
    return _zip(tmp_path_factory, "dataset_nested.jsonl.zip", member)


@pytest.fixture(scope="session")
def zip_jsonl_with_dir_path(jsonl_path, jsonl2_path, tmp_path_factory):
    members = [(p, os.path.join("main_dir", os.path.basename(p))) for p in (jsonl_path, jsonl2_path)]
    return _zip(tmp_path_factory, "dataset_with_dir.jsonl.zip", members)


@pytest.fixture(scope="session")
def tar_jsonl_path(jsonl_path, jsonl2_path, tmp_path_factory):
    return _tar(tmp_path_factory, "dataset.jsonl.tar", [(p, os.path.basename(p)) for p in (jsonl_path, jsonl2_path)])


@pytest.fixture(scope="session")
def tar_nested_jsonl_path(tar_jsonl_path, tmp_path_factory):
    member = [(tar_jsonl_path, os.path.join("nested", os.path.basename(tar_jsonl_path)))]
    return _tar(tmp_path_factory, "dataset_nested.jsonl.tar", member)


@pytest.fixture(scope="session")
def text_path(tmp_path_factory):
    return _text(tmp_path_factory, "dataset.txt")


@pytest.fixture(scope="session")
def text2_path(tmp_path_factory):
    return _text(tmp_path_factory, "dataset2.txt")


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("data_text_dir") / "dataset.txt"
    path.write_text("".join(line + "\n" for line in TEXT_LINES))
    return path.parent


@pytest.fixture(scope="session")
def text_dir_with_unsupported_extension(tmp_path_factory):
    return Path(_text(tmp_path_factory, "dataset.abc"))


@pytest.fixture(scope="session")
def zip_text_path(text_path, text2_path, tmp_path_factory):
    return _zip(tmp_path_factory, "dataset.text.zip", [(p, os.path.basename(p)) for p in (text_path, text2_path)])


@pytest.fixture(scope="session")
def zip_text_with_dir_path(text_path, text2_path, tmp_path_factory):
    members = [(p, os.path.join("main_dir", os.path.basename(p))) for p in (text_path, text2_path)]
    return _zip(tmp_path_factory, "dataset_with_dir.text.zip", members)


@pytest.fixture(scope="session")
def zip_unsupported_ext_path(text_path, text2_path, tmp_path_factory):
    members = [(text_path, "unsupported.ext"), (text2_path, "unsupported_2.ext")]
    return _zip(tmp_path_factory, "dataset.ext.zip", members)


@pytest.fixture(scope="session")
def text_path_with_unicode_new_lines(tmp_path_factory):
    path = _new(tmp_path_factory, "dataset_with_unicode_new_lines.txt")
    path.write_text("First\nSecond\u2029with Unicode new line\nThird", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def data_dir_with_hidden_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_dir")
    for sub in ("subdir", ".subdir"):
        (root / sub).mkdir()
        (root / sub / "train.txt").write_text("foo\n" * 10)
        (root / sub / "test.txt").write_text("bar\n" * 10)
    (root / "subdir" / ".test.txt").write_text("bar\n" * 10)
    return root


# -- fsspec filesystems backed by a local directory ------------------------------------------------


class MockFileSystem(AbstractFileSystem):
    """``mock://a/b`` is ``<local_root_dir>/a/b``; listings answer root-relative names."""

    protocol = "mock"

    def __init__(self, *args, local_root_dir, **kwargs):
        super().__init__()
        self._fs = LocalFileSystem(*args, **kwargs)
        self.local_root_dir = Path(local_root_dir).resolve().as_posix() + "/"

    def _local(self, path):
        return posixpath.join(self.local_root_dir, self._strip_protocol(path))

    def _relative(self, name):
        return name[len(self.local_root_dir):]

    @classmethod
    def _strip_protocol(cls, path):
        path = stringify_path(path)
        prefix = cls.protocol + "://"
        return path[len(prefix):] if path.startswith(prefix) else path

    def ls(self, path, detail=True, *args, **kwargs):
        entries = self._fs.ls(self._local(path), detail=detail, *args, **kwargs)
        if detail:
            return [{**entry, "name": self._relative(entry["name"])} for entry in entries]
        return [self._relative(name) for name in entries]

    def info(self, path, *args, **kwargs):
        entry = dict(self._fs.info(self._local(path), *args, **kwargs))
        entry["name"] = self._relative(entry["name"])
        return entry

    def cp_file(self, path1, path2, *args, **kwargs):
        return self._fs.cp_file(self._local(path1), self._local(path2), *args, **kwargs)

    def _open(self, path, *args, **kwargs):
        return self._fs._open(self._local(path), *args, **kwargs)


def _delegate(name):
    def method(self, path, *args, **kwargs):
        return getattr(self._fs, name)(self._local(path), *args, **kwargs)

    method.__name__ = name
    return method


for _name in ("mkdir", "makedirs", "rmdir", "rm_file", "rm", "created", "modified"):
    setattr(MockFileSystem, _name, _delegate(_name))


class TmpDirFileSystem(MockFileSystem):
    """``tmp://x`` under a directory the ``tmpfs`` fixture chooses."""

    protocol = "tmp"
    tmp_dir = None

    def __init__(self, *args, **kwargs):
        assert self.tmp_dir is not None, "TmpDirFileSystem.tmp_dir is not set"
        super().__init__(*args, **kwargs, local_root_dir=self.tmp_dir, auto_mkdir=True)


@pytest.fixture
def mock_fsspec():
    fsspec_registry["mock"] = MockFileSystem
    fsspec_registry["tmp"] = TmpDirFileSystem
    yield
    del fsspec_registry["mock"]
    del fsspec_registry["tmp"]


@pytest.fixture
def mockfs(tmp_path_factory, mock_fsspec):
    return MockFileSystem(local_root_dir=tmp_path_factory.mktemp("mockfs"), auto_mkdir=True)


@pytest.fixture
def tmpfs(tmp_path_factory, mock_fsspec):
    with patch.object(TmpDirFileSystem, "tmp_dir", tmp_path_factory.mktemp("tmpfs")):
        yield TmpDirFileSystem()
        TmpDirFileSystem.clear_instance_cache()
