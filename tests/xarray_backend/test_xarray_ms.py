"""The ``ctdsfs`` xarray engine against xarray-ms (its oracle, with arcae's casacore) on
MeasurementSets python-casacore writes: the same DataTree (xarray.testing.assert_identical,
but for the attrs naming the software and the time of opening), the same errors, lazy
ranged reads, Dask chunks and pickling."""

import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from ctdsfs.formats.casacore.columns import CasacoreTable
from ctdsfs.xarray_backend import CtdsfsBackendEntrypoint
from ctdsfs.xarray_backend import errors as ours

HERE = Path(__file__).parent
ENGINE = CtdsfsBackendEntrypoint  # (the "ctdsfs" name is checked through the entry point)


def write_ms(path, casarc="", **spec):
    """An MS python-casacore writes (tests/xarray_backend/ms_writer.py), in a process of its own whose
    ``.casarc`` (``casarc``) may ask for MultiFile storage or big-endian files."""
    home = Path(path).parent / f".home-{Path(path).name}"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".casarc").write_text(casarc)
    subprocess.run([sys.executable, str(HERE / "ms_writer.py"), str(path), json.dumps(spec)],
                   check=True, env=dict(os.environ, HOME=str(home)))
    return str(path)


def _settled(tree):
    """The tree loaded, without the attrs that name the software or the time of opening."""
    tree = tree.load().copy()
    for node in tree.subtree:
        for name in ("creation_date", "creator"):
            node.attrs.pop(name, None)
        if "data_groups" in node.attrs:
            node.attrs["data_groups"]["base"].pop("date")
    return tree


def _opened(where, engine, **options):
    """``where``'s settled tree and the warning classes raised opening it (by name)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tree = _settled(xr.open_datatree(where, engine=engine, **options))
    return tree, sorted({w.category.__name__ for w in caught})


_EXPECTED = {}  # (MS, options) -> xarray-ms's tree and warnings: several sources share one


def open_both(source, reference=None, storage_options=None, **options):
    """(xarray-ms's tree of ``reference`` or ``source``, ctdsfs's of ``source``) and the
    warning classes each raised (by name)."""
    key = (str(reference or source), json.dumps(options, sort_keys=True))
    if key not in _EXPECTED:
        _EXPECTED[key] = _opened(reference or source, "xarray-ms:msv2", **options)
    got = _opened(source, ENGINE, storage_options=storage_options, **options)
    return [_EXPECTED[key][0], got[0]], [_EXPECTED[key][1], got[1]]


def assert_same_tree(source, reference=None, storage_options=None, **options):
    (expected, got), (warned, ours_warned) = open_both(source, reference, storage_options,
                                                       **options)
    assert list(got.children) == list(expected.children)
    for node in expected.subtree:
        xr.testing.assert_identical(got[node.path].to_dataset(inherit=False),
                                    node.to_dataset(inherit=False))
    xr.testing.assert_identical(got, expected)
    assert ours_warned == warned
    return got, warned


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    """Two SPWs (8 and 4 channels), 4, 2 and 1 correlations, autocorrelations, reversed
    and missing baselines, two fields and two intents, WEIGHT_SPECTRUM, CORRECTED_DATA and
    MODEL_DATA, a SOURCE table; tiled storage managers."""
    return write_ms(tmp_path_factory.mktemp("xms") / "rich.ms")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """StandardStMan only, no autocorrelations, irregular intervals and channel widths, two
    observations, empty STATE (made up), no SOURCE, no spectra (WEIGHT and SIGMA spread)."""
    return write_ms(tmp_path_factory.mktemp("xms") / "plain.ms", layout="ssm",
                    autocorrs=False, weight_spectrum=False, corrected=False,
                    irregular_interval=True, irregular_width=True, observations=2,
                    states=[], source=False)


OPTIONS = [{}, {"auto_corrs": True}, {"partition_schema": ["FIELD_ID", "SCAN_NUMBER"]},
           {"partition_schema": ["STATE_ID", "SOURCE_ID", "SUB_SCAN_NUMBER"],
            "auto_corrs": True}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: json.dumps(o))
def test_rich_ms_same_tree(rich, options):
    tree, warned = assert_same_tree(rich, **options)
    assert "IrregularBaselineGridWarning" in warned  # (missing rows filled, flagged)
    first = tree[list(tree.children)[0]]
    assert first.FLAG.dtype == np.uint8 and first.VISIBILITY.dtype == np.complex64
    assert {"CORRECTED_DATA", "MODEL_DATA", "SIGMA_SPECTRUM"} <= set(first.data_vars)
    assert sorted({tree[c].sizes["polarization"] for c in tree.children}) == [1, 2, 4]
    assert sorted({tree[c].sizes["frequency"] for c in tree.children}) == [4, 8]
    if options.get("auto_corrs"):
        assert first.sizes["baseline_id"] == 10


@pytest.mark.parametrize("options", OPTIONS[:2], ids=lambda o: json.dumps(o))
def test_plain_ms_same_tree(plain, options):
    tree, warned = assert_same_tree(plain, **options)
    assert {"IrregularTimeGridWarning", "IrregularChannelGridWarning",
            "ImputedMetadataWarning"} <= set(warned)
    first = tree[list(tree.children)[0]]
    assert {"TIME", "INTEGRATION_TIME", "CHANNEL_WIDTH"} <= set(first.data_vars)
    assert first.scan_name.attrs["scan_intents"] == ["UNSPECIFIED"]
    assert len(tree.children) == 6  # 2 observations x 3 data descriptions


@pytest.mark.parametrize("casarc", ["table.storage.option: multifile\n",
                                    "table.endianformat: big\n"], ids=["multifile", "big"])
def test_multifile_and_big_endian_same_tree(tmp_path, casarc):
    path = write_ms(tmp_path / "obs.ms", casarc, spws=[4], ddids=[[0, 0]], fields=1)
    assert_same_tree(path)
    if "multifile" in casarc:
        assert Path(path, "table.mf").exists() and Path(path, "ANTENNA", "table.mf").exists()


@pytest.mark.parametrize("pointing", ["regular", "irregular", "duplicate"])
def test_pointing_same_tree(tmp_path, pointing):
    path = write_ms(tmp_path / "obs.ms", spws=[4], ddids=[[0, 0], [0, 1]], fields=1,
                    missing=False, pointing=pointing)
    tree, warned = assert_same_tree(path)
    made = ["pointing_xds" in tree[c].children for c in tree.children]
    # (a repeated (TIME, ANTENNA_ID): no grid for the partitions whose span holds it)
    assert all(made) == (pointing != "duplicate") and any(made)
    assert ("IrregularSubtableGridWarning" in warned) == (pointing == "irregular")
    assert ("DuplicateSubtableRowWarning" in warned) == (pointing == "duplicate")


def test_pointing_direction_of_another_shape_is_named(tmp_path):
    import casacore.tables as ct

    path = write_ms(tmp_path / "obs.ms", spws=[4], ddids=[[0, 0]], fields=1, missing=False,
                    pointing="regular")
    with ct.table(f"{path}/POINTING", readonly=False, ack=False) as pointing:
        pointing.putcol("DIRECTION", np.zeros((pointing.nrows(), 1, 3)))
    with pytest.raises(ours.InvalidMeasurementSet, match="POINTING: DIRECTION cells of "
                       r"shape \(1, 3\)"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xr.open_datatree(path, engine=ENGINE)


@pytest.mark.parametrize("weather", ["antenna", "station"])
def test_weather_same_tree(tmp_path, weather):
    path = write_ms(tmp_path / "obs.ms", spws=[4], ddids=[[0, 0]], fields=1, missing=False,
                    weather=weather)
    tree, _ = assert_same_tree(path)
    first = tree[list(tree.children)[0]]
    assert first["weather_xds"].PRESSURE.attrs["units"] == "Pa"
    assert first["weather_xds"].sizes["station_name"] == (2 if weather == "station" else 3)


@pytest.fixture(scope="module")
def gridded(tmp_path_factory):
    """Irregular POINTING (with intervals), WEATHER by antenna and SYSCAL rows."""
    return write_ms(tmp_path_factory.mktemp("xms") / "grid.ms", spws=[4], ddids=[[0, 0]],
                    fields=1, missing=False, pointing="irregular", weather="antenna",
                    syscal=True)


@pytest.mark.parametrize("interpolate", ["pointing", ["sys_cal", "weather"],
                                         ("pointing", "sys_cal", "weather")],
                         ids=lambda i: json.dumps(i))
def test_interpolated_on_the_partitions_times_same_tree(gridded, interpolate):
    tree, _ = assert_same_tree(gridded, interpolate=interpolate)
    first = tree[list(tree.children)[0]]
    names = {interpolate} if isinstance(interpolate, str) else set(interpolate)
    for name, node in (("pointing", "pointing_xds"), ("sys_cal", "system_calibration_xds"),
                       ("weather", "weather_xds")):
        assert ("time" in first[node].to_dataset(inherit=False).dims) == (name in names)
    with pytest.raises(ValueError, match="Invalid interpolate values"):
        xr.open_datatree(gridded, engine=ENGINE, interpolate="antenna")


def test_system_calibration_same_tree(tmp_path):
    path = write_ms(tmp_path / "obs.ms", spws=[4, 8], ddids=[[0, 0], [1, 1]], fields=1,
                    missing=False, syscal=True)
    tree, _ = assert_same_tree(path)
    made = tree[list(tree.children)[0]]["system_calibration_xds"]
    assert {"TSYS", "TANT_SYS", "TCAL", "PHASE_DIFFERENCE"} <= set(made.data_vars)
    assert made.TCAL.dims[2:] == ("receptor_label", "frequency_system_cal")


def test_phased_array_same_tree(tmp_path):
    path = write_ms(tmp_path / "obs.ms", spws=[4], ddids=[[0, 0]], fields=1, missing=False,
                    phased_array="stations")
    tree, _ = assert_same_tree(path)
    made = tree[list(tree.children)[0]]["phased_array_xds"]
    assert made.sizes["element_id"] == 6  # (stations of 3 to 6 elements, padded)
    assert made.PHASED_ARRAY_ELEMENT_COUNT.values.tolist() == [6, 5, 4, 3]


def test_phased_array_cell_undefined_is_named(tmp_path):
    path = write_ms(tmp_path / "obs.ms", spws=[4], ddids=[[0, 0]], fields=1, missing=False,
                    phased_array="undefined")
    with pytest.raises(ours.InvalidMeasurementSet, match="PHASED_ARRAY: row 3 has no "
                       "ELEMENT_OFFSET"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xr.open_datatree(path, engine=ENGINE)


def test_flag_row_spread_when_there_is_no_flag(tmp_path):
    """Without FLAG, FLAG is FLAG_ROW over frequency and polarization. (xarray-ms 0.5.13
    opens such an MS but fails to load its FLAG: arcae refuses the scalar column.)"""
    import casacore.tables as ct

    path = write_ms(tmp_path / "obs.ms", flag_row_only=True, missing=False,
                    spws=[4], ddids=[[0, 0]], fields=1, states=["A"])
    expected = xr.open_datatree(path, engine="xarray-ms:msv2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = xr.open_datatree(path, engine=ENGINE)
    part = list(got.children)[0]
    xr.testing.assert_identical(got[part].to_dataset().drop_vars("FLAG").load().drop_attrs(),
                                expected[part].to_dataset().drop_vars("FLAG").load()
                                .drop_attrs())
    with ct.table(path, ack=False) as ms:
        flag_row, time = ms.getcol("FLAG_ROW"), ms.getcol("TIME")
        a1, a2 = ms.getcol("ANTENNA1"), ms.getcol("ANTENNA2")
    flag = got[part].FLAG.values
    assert flag.shape[2:] == (4, 4)
    times = np.unique(time)
    for row in np.flatnonzero(a1 != a2):
        t = np.searchsorted(times, time[row])
        lo, hi = sorted((a1[row], a2[row]))
        b = [(i, j) for i in range(4) for j in range(i + 1, 4)].index((lo, hi))
        assert (flag[t, b] == flag_row[row]).all()


@pytest.mark.parametrize("spec, error", [
    ({"duplicate": True, "autocorrs": False}, "PartitioningError"),
    ({"feed_rows": 3}, "InvalidMeasurementSet"),
])
def test_errors_as_xarray_ms(tmp_path, spec, error):
    path = write_ms(tmp_path / "obs.ms", spws=[4], ddids=[[0, 0]], missing=False, **spec)
    with pytest.raises(ValueError) as theirs:
        xr.open_datatree(path, engine="xarray-ms:msv2")
    with pytest.raises(getattr(ours, error)):
        xr.open_datatree(path, engine=ENGINE)
    assert type(theirs.value).__name__ == error


def test_partition_keys_in_all_forms(rich):
    key = (("DATA_DESC_ID", 1), ("OBSERVATION_ID", 0),
           ("OBS_MODE", "OBSERVE_TARGET#ON_SOURCE"), ("PROCESSOR_ID", 0))
    for form in (key, "D=1,OM=OBSERVE_TARGET#ON_SOURCE", "DATA_DESC_ID=1,OBS_MODE="
                 "OBSERVE_TARGET#ON_SOURCE"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = xr.open_dataset(rich, engine=ENGINE, partition_key=form)
            expected = xr.open_dataset(rich, engine="xarray-ms:msv2", partition_key=form)
        for ds in (got, expected):
            ds.attrs.pop("creation_date")
            ds.attrs.pop("creator")
        xr.testing.assert_identical(got.load(), expected.load())
        assert got.sizes["polarization"] == 2
    with pytest.raises(ours.InvalidPartitionKey):
        xr.open_dataset(rich, engine=ENGINE, partition_key="NOT_A_COLUMN=1")


def _recorded_reads(monkeypatch):
    spans = []
    read = CasacoreTable.read_column

    def recording(self, name, start=0, stop=None):
        spans.append((name, start, stop))
        return read(self, name, start, stop)
    monkeypatch.setattr(CasacoreTable, "read_column", recording)
    return spans


def test_isel_reads_only_the_rows_of_that_time(rich, monkeypatch):
    import casacore.tables as ct

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_dataset(rich, engine=ENGINE, partition_key=(
            ("DATA_DESC_ID", 0), ("OBS_MODE", "CALIBRATE_PHASE,ON_SOURCE")))
    spans = _recorded_reads(monkeypatch)
    one = ds.VISIBILITY.isel(time=1).values
    with ct.table(rich, ack=False) as ms:
        time = ms.getcol("TIME")
        rows = np.flatnonzero(time == ds.time.values[1] + 3506716800.0)
    assert spans and all(name == "DATA" for name, _, _ in spans)
    read = set().union(*(range(a, b) for _, a, b in spans))
    assert read <= set(range(rows.min(), rows.max() + 1))
    xr.testing.assert_identical(ds.VISIBILITY.isel(time=1), ds.VISIBILITY.load().isel(time=1))
    assert one.shape == (6, 8, 4)


def test_chunks_give_dask_arrays_and_datasets_pickle(rich):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = xr.open_datatree(rich, engine=ENGINE, chunks={})
        eager = xr.open_datatree(rich, engine=ENGINE)
    part = list(tree.children)[0]
    import dask.array as da

    assert isinstance(tree[part].VISIBILITY.data, da.Array)
    xr.testing.assert_equal(tree[part].to_dataset().load(), eager[part].to_dataset().load())
    ds = eager[part].to_dataset()
    again = pickle.loads(pickle.dumps(ds))
    xr.testing.assert_identical(again.load(), ds.load())
    lazy = pickle.loads(pickle.dumps(tree[part].to_dataset()))
    xr.testing.assert_equal(lazy.compute(), ds.load())


def test_engine_is_registered_by_its_entry_point():
    """pyproject's ``xarray.backends`` entry point names the engine ``ctdsfs`` (pip
    install -e makes it)."""
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="xarray.backends") if e.name == "ctdsfs"]
    assert found and found[0].value == "ctdsfs.xarray_backend:CtdsfsBackendEntrypoint"
    assert "ctdsfs" in xr.backends.list_engines()
