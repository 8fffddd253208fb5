"""casacore columns from object storage (a real SeaweedFS): the fsspec filesystem with
``columns=True`` (ranged reads fetch only the tiles of the rows asked for; it pickles),
``mount.ctdsfs -o columns`` of an ``s3://`` container and prefix, and a dask.array read by
the worker processes of a real ``distributed.LocalCluster``; all equal to getcol."""

import io
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import casacore.tables as ct
import fsspec
import numpy as np
import pytest

from ctdsfs.remote import store as remote
from ctdsfs.toolbox import pack

from ..conftest import BUCKET
from ..formats.casacore.test_columns import write_table
from ..servers import CREDENTIALS

NROW = 2048  # DATA: 64 channels x 4 correlations, tiles of 64 rows x 16 channels (32 KiB)
TILE_ROW_BYTES = 4 * 32 << 10  # the four tiles that hold 64 rows of DATA
LARGE_NROW = 8192  # an MS whose DATA lies past the first 8 MiB (the default chunk) of its container


@pytest.fixture(scope="module")
def store(seaweed, web, objects, tmp_path_factory):
    """The session's SeaweedFS (tests/remote/test_remote.py) also holding an MS packed by ``ctdsfs
    pack`` (``columns/obs.mf``) and the same MS in separate files (``columns/plain.ms/``),
    and a LocalCluster of two worker processes for the module."""
    from distributed import Client, LocalCluster

    where = tmp_path_factory.mktemp("columns-s3")
    plain = write_table(where / "plain.ms", "ms", str(NROW))
    pack(plain, str(where / "obs.mf"), quiet=True)
    large = write_table(where / "large.ms", "ms", str(LARGE_NROW))
    pack(large, str(where / "large.mf"), quiet=True)
    seaweed.client.put_object(Bucket=BUCKET, Key="columns/large.mf",
                              Body=(where / "large.mf").read_bytes())
    shutil.copy(where / "obs.mf", objects / "columns-obs.mf")  # what nginx serves
    seaweed.client.put_object(Bucket=BUCKET, Key="columns/obs.mf",
                              Body=(where / "obs.mf").read_bytes())
    for path in Path(plain).rglob("*"):
        if path.is_file():
            seaweed.client.put_object(Bucket=BUCKET, Body=path.read_bytes(),
                                      Key=f"columns/plain.ms/{path.relative_to(plain)}")
    s3 = {"endpoint_url": seaweed.endpoint, "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
          "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None, host="127.0.0.1") as cluster, \
            Client(cluster) as client:
        yield SimpleNamespace(plain=plain, url=seaweed.url("columns/obs.mf"), s3=s3,
                              large=large, large_url=seaweed.url("columns/large.mf"),
                              endpoint=seaweed.endpoint, dask=client,
                              prefix=seaweed.url("columns/plain.ms/"),
                              http=web.url("columns-obs.mf"))


def getcol(plain, name, start=0, nrow=-1):
    with ct.table(plain, ack=False) as ref:
        return ref.getcol(name, start, nrow)


def test_fsspec_columns_pickle_and_match_getcol(store):
    fs = fsspec.filesystem("ctdsfs", fo=store.url, columns=True, target_options=store.s3)
    chained = fsspec.core.url_to_fs(f"ctdsfs::{store.url}", s3=store.s3,
                                    ctdsfs={"columns": True})[0]
    assert "columns" not in fsspec.filesystem("ctdsfs", fo=store.url,
                                              target_options=store.s3).ls("", detail=False)
    for each, names in ((fs, ("DATA", "FLAG", "UVW")), (chained, ("FLAG",)),
                        (pickle.loads(pickle.dumps(fs)), ("UVW",))):
        for name in names:
            got = np.load(io.BytesIO(each.cat_file(f"columns/{name}.npy")))
            np.testing.assert_array_equal(got, getcol(store.plain, name), err_msg=name)
    with fs.open("ANTENNA/columns/POSITION.npy") as f:
        np.testing.assert_array_equal(np.load(f), getcol(store.plain + "/ANTENNA", "POSITION"))
    over_http = fsspec.filesystem("ctdsfs", fo=store.http, columns=True)
    np.testing.assert_array_equal(np.load(io.BytesIO(over_http.cat_file("columns/UVW.npy"))),
                                  getcol(store.plain, "UVW"))


@pytest.mark.parametrize("chunk", [None, 16 << 10, 64 << 10])
def test_a_row_range_fetches_only_the_rows_bytes_of_its_tiles(store, monkeypatch, chunk):
    """Rows 5000..5100 of DATA lie in three rows of tiles (each tile of 16 of the 64
    channels), past the container's first chunk: only the rows' bytes in each tile are
    fetched, at most one tile row beyond them, with the default chunks of 8 MiB as with
    small ones (a read that jumps into a chunk GETs its own bytes)."""
    fetched = []
    original = remote.RemoteStore._get
    monkeypatch.setattr(remote.RemoteStore, "_get", lambda self, start, end, version: (
        fetched.append((start, end)), original(self, start, end, version))[1])
    options = dict(store.s3, **({"chunk_size": chunk} if chunk else {}))
    fs = fsspec.filesystem("ctdsfs", fo=store.large_url, columns=True,
                           target_options=options, skip_instance_cache=True)
    path = "columns/DATA.npy"
    size = fs.size(path)
    header = size - LARGE_NROW * 64 * 4 * 8
    fs.cat_file(path, 0, header)  # the view is listed (table.dat, managers' headers)
    fetched.clear()
    row = 64 * 4 * 8
    piece = fs.cat_file(path, header + 5000 * row, header + 5100 * row)
    assert piece == getcol(store.large, "DATA", 5000, 100).tobytes()
    assert min(start for start, _ in fetched) >= remote.RemoteOptions.chunk_size
    got = sum(end - start for start, end in fetched)
    assert 100 * row <= got <= 100 * row + TILE_ROW_BYTES, got


def test_s3_mounts_show_columns(store, mount):
    options = ["columns", f"endpoint_url={store.endpoint}"]
    for source in (store.url, store.prefix):
        m = mount(source, options)
        np.testing.assert_array_equal(np.load(m.mountpoint / "columns" / "FLAG.npy"),
                                      getcol(store.plain, "FLAG"), err_msg=source)
        antenna = m.mountpoint / "ANTENNA" / "columns"
        np.testing.assert_array_equal(np.load(antenna / "POSITION.npy"),
                                      getcol(store.plain + "/ANTENNA", "POSITION"))


def test_dask_workers_read_their_own_rows(store):
    from distributed import get_task_stream

    from ctdsfs.dask_columns import column_array

    array = column_array(store.url, "DATA", chunks=256, **store.s3)
    assert array.npartitions == NROW // 256
    with get_task_stream(store.dask) as tasks:
        got = array.compute()
    np.testing.assert_array_equal(got, getcol(store.plain, "DATA"))
    assert len({t["worker"] for t in tasks.data}) == 2  # both processes read
    part = column_array(store.url, "FLAG", chunks=700, **store.s3)[500:1600]
    np.testing.assert_array_equal(part.compute(), getcol(store.plain, "FLAG", 500, 1100))
