"""Hostile ids in a MeasurementSet python-casacore 3.8 wrote, opened by the ``ctdsfs``
engine: an id that names no row of the table it points into (below -1, MSv2's "none";
negative where there is no "none"; past the table, or so large that the rows made up for
it cannot be held) is InvalidMeasurementSet in one
line, never an IndexError, a row counted from the end, or an allocation of 2**31 rows
(within a 4 GiB address space, so that one fails rather than swaps)."""

import shutil
import warnings

import casacore.tables as ct
import numpy as np
import pytest
import xarray as xr

from ctdsfs.xarray_backend.errors import InvalidMeasurementSet, PartitioningError

from ..address_space import address_space
from .test_xarray_ms import ENGINE, write_ms

BIG = 2**31 - 1


def refused(path, error, message):
    """Opening and loading the MS at ``path`` raises ``error`` in one line, within 4 GiB more
    address space."""
    with address_space(), warnings.catch_warnings(), pytest.raises(error) as caught:
        warnings.simplefilter("ignore")  # (ImputedMetadataWarning before the refusal)
        xr.open_datatree(str(path), engine=ENGINE).load()
    assert message in str(caught.value) and "\n" not in str(caught.value)


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
    refused(path, InvalidMeasurementSet, message)


def _with_feed_antennas(path, count, in_antenna):
    """FEED rows for ``count`` more antennas (every spectral window, feed 0), and, when
    ``in_antenna``, ANTENNA rows for them (a file of a few MiB either way)."""
    with ct.table(str(path / "FEED"), readonly=False, ack=False) as feed:
        first = feed.nrows()
        feed.addrows(count)
        feed.putcol("ANTENNA_ID", np.arange(first, first + count, dtype=np.int32), first,
                    count)
        feed.putcol("SPECTRAL_WINDOW_ID", np.full(count, -1, np.int32), first, count)
        feed.putcol("FEED_ID", np.zeros(count, np.int32), first, count)
        feed.putcol("NUM_RECEPTORS", np.full(count, 2, np.int32), first, count)
    if in_antenna:
        with ct.table(str(path / "ANTENNA"), readonly=False, ack=False) as antenna:
            antenna.addrows(first + count - antenna.nrows())


@pytest.mark.parametrize("count,in_antenna,error,message", [
    (300, False, InvalidMeasurementSet, "does not exist in ANTENNA"),
    (30000, True, PartitioningError, "more than this process can hold")])
def test_feed_antennas_the_rows_never_use(ms, tmp_path, count, in_antenna, error, message):
    """FEED names the baselines of the grid: antennas past ANTENNA's rows were indexed
    (IndexError), and 30,000 of them (a FEED of 3 MiB) made a lookup of 30,000 squared
    int64 and a grid of 450 million baselines a time (MemoryError)."""
    path = tmp_path / "obs.ms"
    shutil.copytree(ms, path)
    _with_feed_antennas(path, count, in_antenna)
    refused(path, error, message)
