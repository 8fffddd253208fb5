"""The ``ctdsfs`` engine on MeasurementSets whose columns casacore 3.8's compressing storage
managers hold, against xarray-ms on the same MS: DATA and WEIGHT_SPECTRUM in DyscoStMan
(lossy: both engines must give the values casacore decodes), DATA in SiscoStMan, and DATA
and WEIGHT_SPECTRUM in StokesIStMan with ANTENNA1/2 in AntennaPairStMan and UVW in
UvwStMan. arcae bundles casacore 3.8.1, which reads all of them, so xarray-ms is the
oracle as for the other MSes; the Dysco MS is also compared packed, through ``s3://``."""

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.toolbox import pack

from ..conftest import BUCKET
from ..servers import CREDENTIALS
from .ms_writer import COMPRESSED
from .test_xarray_ms import assert_same_tree, write_ms

# one DATA_DESCRIPTION (fixed cell shapes); every time the same baselines for DyscoStMan
# (casacore writes but cannot read back a Dysco column whose time steps lack rows), UvwStMan,
# and AntennaPairStMan's repeating pattern
SPECS = {"dysco": {"missing": False}, "sisco": {},
         "stokes": {"reversed": False, "missing": False}}


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """{layout: its MS}, each column checked to be in the manager the layout names."""
    where = tmp_path_factory.mktemp("xcompressed")
    written = {}
    for layout, spec in SPECS.items():
        ms = written[layout] = write_ms(where / f"{layout}.ms", layout=layout,
                                        ddids=[[0, 0]], corrected=False, **spec)
        with ct.table(ms, ack=False) as table:
            managers = {column: info["TYPE"] for info in table.getdminfo().values()
                        for column in info["COLUMNS"]}
        for manager, columns in COMPRESSED[layout].items():
            assert {managers[c] for c in columns} == {manager}
    return written


@pytest.mark.parametrize("layout", sorted(SPECS))
def test_compressed_ms_same_tree(compressed, layout):
    ms = compressed[layout]
    tree, _ = assert_same_tree(ms)
    with ct.table(ms, ack=False) as table:
        decoded = np.unique(table.getcol("DATA"))
    visibilities = tree[list(tree.children)[0]].VISIBILITY.values
    shown = np.unique(visibilities[np.isfinite(visibilities)])
    assert shown.size > 1 and np.isin(shown, decoded).all()  # (casacore's decoded values)


def test_dysco_ms_packed_through_s3_same_tree(compressed, seaweed, tmp_path):
    ms = compressed["dysco"]
    pack(ms, str(tmp_path / "dysco.mf"), quiet=True)
    seaweed.client.put_object(Bucket=BUCKET, Key="xarray/dysco.mf",
                              Body=(tmp_path / "dysco.mf").read_bytes())
    options = {"endpoint_url": seaweed.endpoint, "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
               "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
    assert_same_tree(seaweed.url("xarray/dysco.mf"), ms, storage_options=options)
