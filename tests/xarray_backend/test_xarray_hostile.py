"""Hostile ids in a MeasurementSet python-casacore 3.8 wrote, opened by the ``ctdsfs``
engine: an id that names no row of the table it points into (below -1, MSv2's "none";
negative where there is no "none"; past the table, or so large that the rows made up for
it cannot be held) is InvalidMeasurementSet in one
line, never an IndexError, a row counted from the end, or an allocation of 2**31 rows
(within a 4 GiB address space, so that one fails rather than swaps)."""

import resource
import shutil
import warnings

import casacore.tables as ct
import pytest
import xarray as xr

from ctdsfs.xarray_backend.errors import InvalidMeasurementSet

from .test_xarray_ms import ENGINE, write_ms

BIG = 2**31 - 1


@pytest.fixture(scope="module")
def ms(tmp_path_factory):
    return write_ms(tmp_path_factory.mktemp("xhostile") / "obs.ms", spws=[4],
                    ddids=[[0, 0]], fields=1)


# (subtable, column, value, what the refusal says)
IDS = [("", "FIELD_ID", -5, "FIELD_ID -5 names no row"),
       ("", "FIELD_ID", BIG, "too large for its rows to be made up"),
       ("", "STATE_ID", -7, "STATE_ID -7 names no row"),
       ("", "STATE_ID", BIG, "too large for its rows to be made up"),
       ("", "OBSERVATION_ID", -2, "OBSERVATION_ID -2 names no row"),
       ("", "OBSERVATION_ID", BIG, "too large for its rows to be made up"),
       ("", "PROCESSOR_ID", -2, "PROCESSOR_ID -2 names no row"),
       ("", "PROCESSOR_ID", BIG, "too large for its rows to be made up"),
       ("", "DATA_DESC_ID", -3, "DATA_DESC_ID -3 does not exist"),
       ("DATA_DESCRIPTION", "SPECTRAL_WINDOW_ID", -1, "SPECTRAL_WINDOW_ID -1 does not exist"),
       ("DATA_DESCRIPTION", "SPECTRAL_WINDOW_ID", 9, "SPECTRAL_WINDOW_ID 9 does not exist"),
       ("DATA_DESCRIPTION", "POLARIZATION_ID", -1, "POLARIZATION_ID -1 does not exist"),
       ("DATA_DESCRIPTION", "POLARIZATION_ID", 9, "POLARIZATION_ID 9 does not exist"),
       ("FIELD", "SOURCE_ID", -3, "SOURCE_ID -3 names no row"),
       ("FIELD", "SOURCE_ID", BIG, "too large for its rows to be made up"),
       ("POLARIZATION", "CORR_TYPE", -1, "CORR_TYPE -1 is not a Stokes type"),
       ("POLARIZATION", "CORR_TYPE", 99, "CORR_TYPE 99 is not a Stokes type")]


@pytest.mark.parametrize("subtable,column,value,message", IDS,
                         ids=[f"{s or 'MAIN'}.{c}={v}" for s, c, v, _ in IDS])
def test_an_id_that_names_no_row(ms, tmp_path, subtable, column, value, message):
    path = tmp_path / "obs.ms"
    shutil.copytree(ms, path)
    with ct.table(str(path / subtable), readonly=False, ack=False) as table:
        cell = table.getcell(column, 0)
        if column == "CORR_TYPE":
            cell[0] = value
        table.putcell(column, 0, cell if column == "CORR_TYPE" else value)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))
    try:
        with warnings.catch_warnings(), pytest.raises(InvalidMeasurementSet) as caught:
            warnings.simplefilter("ignore")  # (ImputedMetadataWarning before the refusal)
            xr.open_datatree(str(path), engine=ENGINE).load()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert message in str(caught.value) and "\n" not in str(caught.value)
