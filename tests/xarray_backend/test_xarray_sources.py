"""The ``ctdsfs`` engine on the other sources ctdsfs opens, each compared with xarray-ms
on the same MS opened locally: containers packed by ``ctdsfs pack`` (MultiFile v2 and
MultiHDF5), the MultiFile one on nginx through ``https://`` and on SeaweedFS through
``s3://`` (also read by a ``distributed.LocalCluster``'s workers), and the MS directory's
files under an ``s3://`` prefix."""

import shutil
import warnings
from pathlib import Path

import pytest
import xarray as xr

from ctdsfs.toolbox import pack

from ..conftest import BUCKET
from ..servers import CREDENTIALS
from .test_xarray_ms import ENGINE, assert_same_tree, write_ms


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The MS of tests/xarray_backend/ms_writer.py (two SPWs, three correlation setups, ...) and the same
    MS packed into one container (``rich.mf``: its name gives the partitions' names)."""
    where = tmp_path_factory.mktemp("xsrc")
    ms = write_ms(where / "rich.ms")
    pack(ms, str(where / "rich.mf"), quiet=True)
    return ms, str(where / "rich.mf")


@pytest.mark.parametrize("form", ["mf2", "hdf5"])
def test_packed_container_same_tree(packed, tmp_path, form):
    ms, container = packed
    if form == "hdf5":
        container = str(tmp_path / "rich.mfh5")
        pack(ms, container, format="hdf5", quiet=True)
    assert_same_tree(container, ms)


def test_https_same_tree(packed, web, objects, monkeypatch):
    ms, container = packed
    (objects / "xarray").mkdir(exist_ok=True)
    shutil.copy(container, objects / "xarray" / "rich.mf")
    monkeypatch.setenv("SSL_CERT_FILE", str(web.certificate))  # OpenSSL's own convention
    assert_same_tree(web.tls_url("xarray/rich.mf"), ms)


def test_s3_ms_directory_same_tree(packed, seaweed):
    ms = packed[0]
    for path in Path(ms).rglob("*"):
        if path.is_file():
            seaweed.client.put_object(Bucket=BUCKET, Body=path.read_bytes(),
                                      Key=f"xarray/dir/rich.ms/{path.relative_to(ms)}")
    options = {"endpoint_url": seaweed.endpoint, "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    assert_same_tree(seaweed.url("xarray/dir/rich.ms/"), ms, storage_options=options)


def test_s3_same_tree_and_dask_workers(packed, seaweed):
    from distributed import Client, LocalCluster

    ms, container = packed
    with open(container, "rb") as f:
        seaweed.client.put_object(Bucket=BUCKET, Key="xarray/rich.mf", Body=f.read())
    url = seaweed.url("xarray/rich.mf")
    options = {"endpoint_url": seaweed.endpoint, "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    assert_same_tree(url, ms, storage_options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = xr.open_datatree(ms, engine=ENGINE).load()
        remote = xr.open_datatree(url, engine=ENGINE, storage_options=options,
                                  chunks={"time": 2})
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None, host="127.0.0.1") as cluster, \
            Client(cluster):
        for name in list(local.children)[:2]:
            got = remote[name].to_dataset()[["VISIBILITY", "FLAG", "UVW"]].compute()
            xr.testing.assert_equal(got, local[name].to_dataset()[["VISIBILITY", "FLAG",
                                                                   "UVW"]])
