"""DyscoStMan columns (MeasurementSets python-casacore 3.8 writes) decoded without casacore
and compared bit for bit with its getcol: 4 to 16 data bits, every distribution and
normalisation, WEIGHT_SPECTRUM, zeros, NaN and infinite values; in separate files,
MultiFile and packed, through the container API, fsspec, Dask and a mount; hostile files."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import casacore.tables as ct
import fsspec
import numpy as np
import pytest

from ctdsfs.errors import FormatError
from ctdsfs.formats.casacore import dysco as casacore_dysco
from ctdsfs.formats.casacore import dysco_tables
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
from ctdsfs.toolbox import pack

from .dysco_ms import spec, visibilities
from .test_columns import table_source

HERE = Path(__file__).parent
BITS = (4, 6, 8, 10, 12, 16)
DISTRIBUTIONS = ("Gaussian", "Uniform", "TruncatedGaussian", "StudentT")
NORMALISATIONS = ("AF", "RF", "Row")


def write_ms(path, settings, multifile=False):
    home = Path(path).parent / f".home-{Path(path).name}"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".casarc").write_text("table.storage.option: multifile\n" if multifile else "")
    subprocess.run([sys.executable, str(HERE / "dysco_ms.py"), str(path), json.dumps(settings)],
                   check=True, env=dict(os.environ, HOME=str(home)), stdout=subprocess.DEVNULL)
    return str(path)


def matrix(shift):
    """Twelve managers, one per distribution and normalisation, with bit counts shifted by
    ``shift``; DATA's manager (TruncatedGaussian, AF, as LOFAR's pipelines write) also
    holds WEIGHT_SPECTRUM and MODEL_DATA (its columns in that order in its blocks)."""
    managers = []
    for n, (dist, norm) in enumerate((d, m) for d in DISTRIBUTIONS for m in NORMALISATIONS):
        bits = BITS[(n + shift) % len(BITS)]
        columns = [f"D_{dist}_{norm}"]
        if (dist, norm) == ("TruncatedGaussian", "AF"):
            columns = ["DATA", "WEIGHT_SPECTRUM", "MODEL_DATA"]
        managers.append({"name": f"Dysco{n}", "columns": columns,
                         "spec": spec(bits, BITS[(n + shift + 2) % len(BITS)], dist, norm,
                                      nu=1.5 + n, truncation=1.5 + n % 2)})
    return {"managers": managers, "specials": True, "times": 4, "seed": shift}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    where = tmp_path_factory.mktemp("dysco")
    made = {}
    for shift in (0, 3):
        made[f"plain{shift}"] = write_ms(where / f"plain{shift}.ms", matrix(shift))
        if shift == 0:  # (one is enough: the MultiFile is read through the same code)
            made["multifile0"] = write_ms(where / "mf0.ms", matrix(0), True)
        made[f"packed{shift}"] = str(where / f"obs{shift}.mf")
        pack(made[f"plain{shift}"], made[f"packed{shift}"], quiet=True)
    return made


def dysco_columns(path):
    with ct.table(path, ack=False) as t:
        return [c for c in t.colnames() if t.getdminfo(c)["TYPE"] == "DyscoStMan"]


def assert_bit_exact(got, expected, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    mismatch = np.ascontiguousarray(got).view(np.uint32) != \
        np.ascontiguousarray(expected).view(np.uint32)
    assert not mismatch.any(), f"{what}: {mismatch.sum()} of {mismatch.size} words differ"


@pytest.mark.parametrize("kind", ["plain0", "plain3", "multifile0"])
def test_every_column_equals_getcol_bit_for_bit(written, kind):
    path = written[kind]
    names = dysco_columns(path)
    assert len(names) == 14
    with table_source(path) as source, ct.table(path, ack=False) as ref:
        table = open_table(source, path)
        for name in names:
            expected = ref.getcol(name)
            assert_bit_exact(table.read_column(name), expected, name)
            for a, b in [(0, 1), (3, 17), (9, 11), (10, 20), (19, 40), (39, 40)]:
                assert_bit_exact(table.read_column(name, a, b), expected[a:b], f"{name} {a}")
        assert np.isnan(ref.getcol("DATA")).any()  # (the specials reached the files)


@pytest.mark.parametrize("step", [1, 3, 7, 40])
def test_reads_in_order_through_pieces_decoded_ahead(written, monkeypatch, step):
    """A reader going through a column in order is served from pieces decoded whole and
    ahead: here of a few rows each, so that reads start, end and cross inside them."""
    monkeypatch.setattr(casacore_dysco, "PIECE_BYTES", 512)
    path = written["plain3"]
    with table_source(path) as source, ct.table(path, ack=False) as ref:
        table = open_table(source, path)
        for name in dysco_columns(path):
            expected = ref.getcol(name)
            got = [table.read_column(name, a, a + step) for a in range(0, len(expected), step)]
            assert_bit_exact(np.concatenate(got), expected, name)
            assert_bit_exact(table.read_column(name, 5, 9), expected[5:9], f"{name} again")


def test_column_order_and_settings(written):
    """DATA, WEIGHT_SPECTRUM and MODEL_DATA share one manager's blocks; its spec is read
    from the file's header."""
    path = written["plain0"]
    table = open_table(TableDirectory(path), path)
    reader = table._reader(table.columns["DATA"].seqnr)
    assert list(reader.parts) == ["DATA", "WEIGHT_SPECTRUM", "MODEL_DATA"]
    assert reader.rows_per_block == 10 and reader.antennas == 4
    assert table.describe()["columns"]["DATA"]["data_manager"] == "DyscoStMan"
    with ct.table(path, ack=False) as ref:
        assert not np.array_equal(ref.getcol("DATA"), ref.getcol("MODEL_DATA"))


@pytest.mark.parametrize("shift", [0, 3])
def test_packed_through_fsspec_and_dask(written, shift):
    from ctdsfs.dask_columns import column_array

    plain, packed = written[f"plain{shift}"], written[f"packed{shift}"]
    fs = fsspec.filesystem("ctdsfs", fo=packed, columns=True)
    with ct.table(plain, ack=False) as ref:
        for name in dysco_columns(plain):
            with fs.open(f"columns/{name}.npy") as f:
                assert_bit_exact(np.load(f), ref.getcol(name), name)
        got = column_array(packed, "DATA", chunks=7).compute()
        assert_bit_exact(got, ref.getcol("DATA"), "dask DATA")


def test_through_a_mount_and_writes_refused(written, mount):
    for kind in ("plain0", "multifile0", "packed3"):
        m = mount(written[kind], ["columns"] + (["rw"] if kind != "plain0" else []))
        reference = written[kind.replace("packed", "plain")]
        with ct.table(reference, ack=False) as ref:
            for name in dysco_columns(reference):
                got = np.load(m.mountpoint / "columns" / f"{name}.npy")
                assert_bit_exact(got, ref.getcol(name), f"{kind} {name}")
        described = json.loads((m.mountpoint / "columns" / "table.json").read_text())
        assert described["columns"]["WEIGHT_SPECTRUM"]["files"] == ["WEIGHT_SPECTRUM.npy"]
        with pytest.raises(OSError) as caught:
            fd = os.open(m.mountpoint / "columns" / "DATA.npy", os.O_WRONLY)
            try:
                os.pwrite(fd, b"\0" * 8, 200)
            finally:
                os.close(fd)
        assert caught.value.errno in (1, 30)  # EPERM (EROFS: a read-only mount)
        assert "Traceback" not in m.log_text()


def table_values(bits, distribution, nu, truncation, rows, cells):
    """Rows holding every entry of our table for ``bits`` and ``distribution`` (as many
    as fit, each row also holding the largest entry), for the Row normalisation: each
    row's factor is then 1, so casacore stores and decodes our entries unchanged only
    if each is an entry of its own table."""
    table = dysco_tables.decode_table(bits, dysco_tables.NAMES_TO_CODES[distribution], nu,
                                      truncation)[:-1]
    largest = table[-1]
    entries = table[np.abs(table) <= largest]
    per_row = cells - 1
    need = -(-len(entries) // per_row)
    assert need <= rows
    values = np.resize(entries, rows * per_row).reshape(rows, per_row)
    values = np.concatenate([np.full((rows, 1), largest, np.float32), values], axis=1)
    return values, len(entries)


def test_tables_are_casacores(tmp_path):
    """Every entry of our quantisation tables (2 to 16 bits; Gaussian, Uniform,
    TruncatedGaussian at two truncations, StudentT at three nu) comes back from casacore's
    encoding and decoding as an entry of our table (itself, or rarely a neighbour where
    casacore dithers): casacore's tables hold the same values."""
    channels, pols, rows = 64, 4, 132
    cases = [(bits, dist, nu, trunc) for bits in (2, 3) + BITS
             for dist, nu, trunc in (("Gaussian", 0, 0), ("Uniform", 0, 0),
                                     ("TruncatedGaussian", 0, 2.5),
                                     ("TruncatedGaussian", 0, 1.2), ("StudentT", 1.0, 0),
                                     ("StudentT", 3.0, 0), ("StudentT", 8.5, 0))]
    exact, managers = {}, []
    for n, (bits, dist, nu, trunc) in enumerate(cases):
        values, count = table_values(bits, dist, nu, trunc, rows, channels * pols * 2)
        assert count >= (1 << bits) - 2
        name = f"T{n}"
        exact[name] = values.view(np.complex64).reshape(rows, channels, pols)
        managers.append({"name": f"M{n}", "columns": [name],
                         "spec": spec(bits, 8, dist, "Row", nu=nu, truncation=trunc)})
    np.savez(tmp_path / "values.npz", **exact)
    path = write_ms(tmp_path / "tables.ms", {
        "managers": managers, "antennas": 2, "times": rows // 3, "channels": channels,
        "pols": pols, "values": str(tmp_path / "values.npz")})
    table = open_table(TableDirectory(path), path)
    with ct.table(path, ack=False) as ref:
        for name, values in exact.items():
            expected = ref.getcol(name)
            what = f"casacore's {name} {cases[int(name[1:])]}"
            # (casacore's encoder may dither: an entry can come back as its neighbour, which
            # must then be an entry of our table too)
            ours = values.view(np.float32).ravel()
            assert np.isin(expected.view(np.float32), ours).all(), what
            assert np.count_nonzero(expected != values) <= expected.size // 10_000, what
            assert_bit_exact(table.read_column(name), expected, name)


def test_a_last_block_casacore_cannot_read_is_decoded(tmp_path):
    """A table whose last time step is short: casacore reads ANTENNA1 past the table's end
    for the last block and fails; the rows before it equal getcol, the last block's
    rows are decoded from the same factors and symbols (within a step of the values)."""
    settings = {"managers": [{"name": "D", "columns": ["DATA", "WEIGHT_SPECTRUM"],
                              "spec": spec(12, 8, "Gaussian", "AF")}], "cut": 3, "seed": 5}
    path = write_ms(tmp_path / "cut.ms", settings)
    table = open_table(TableDirectory(path), path)
    assert table.nrow == 27
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "WEIGHT_SPECTRUM"):
            assert_bit_exact(table.read_column(name, 0, 20), ref.getcol(name, 0, 20), name)
            with pytest.raises(RuntimeError, match="non-existing row"):
                ref.getcol(name, 20, 7)
    rng = np.random.default_rng(5)  # the values dysco_ms wrote
    pairs = [(a, b) for a in range(4) for b in range(a, 4)]
    autos = np.array([a == b for a, b in pairs] * 3)[:27]
    values = visibilities(rng, (27, 5, 4), False, autos)
    cross = ~autos[20:]  # (AF scales to the cross-correlations: autocorrelations clip)
    got = table.read_column("DATA", 20, 27)[cross]
    assert np.abs(got - values[20:][cross]).max() < np.abs(values[20:][cross]).max() * 0.05


# -- hostile files: one-line refusals naming the file, EIO for damaged rows only

def header_fields(data):
    """{field: (offset, struct format)} of a Dysco header."""
    length = int.from_bytes(data[12:16], "little")
    at = 16 + length
    fields = {"header_size": (0, "<I"), "column_at": (4, "<I"), "columns": (8, "<I"),
              "name_length": (12, "<I")}
    for name, fmt, size in [("rows", "<I", 4), ("antennas", "<I", 4), ("block", "<I", 4),
                            ("major", "<H", 2), ("minor", "<H", 2), ("data_bits", "<B", 1),
                            ("weight_bits", "<B", 1), ("distribution", "<B", 1),
                            ("normalization", "<B", 1), ("nu", "<d", 8),
                            ("truncation", "<d", 8)]:
        fields[name] = (at, fmt)
        at += size
    column_at = int.from_bytes(data[4:8], "little")
    fields["column_header_size"] = (column_at, "<I")
    return fields


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    where = tmp_path_factory.mktemp("small")
    return write_ms(where / "s.ms", {"managers": [{"name": "D", "columns": [
        "DATA", "WEIGHT_SPECTRUM"], "spec": spec(10, 6, "TruncatedGaussian", "AF")}],
        "times": 4})


def damaged_copy(small, tmp_path, field=None, value=None, size=None):
    import struct
    path = tmp_path / "d.ms"
    shutil.copytree(small, path)
    table = open_table(TableDirectory(str(path)), str(path))
    file = path / f"table.f{table.columns['DATA'].seqnr}"
    data = bytearray(file.read_bytes())
    if field is not None:  # (a field, or a tuple of them and a tuple of values)
        fields = header_fields(data)
        for one, number in zip(*((field, value) if isinstance(field, tuple) else
                                 ((field,), (value,)))):
            at, fmt = fields[one]
            struct.pack_into(fmt, data, at, number)
    if size is not None:
        data = data[:size]
    file.write_bytes(bytes(data))
    return str(path), file.name


@pytest.mark.parametrize("field,value,message", [
    ("data_bits", 5, "5 data bits"), ("data_bits", 0, "0 data bits"),
    ("data_bits", 17, "17 data bits"), ("weight_bits", 255, "255 weight bits"),
    ("distribution", 9, "distribution 9"), ("normalization", 3, "normalisation 3"),
    ("distribution", 2, "StudentT with nu 0.0 is not decoded"),
    (("distribution", "nu"), (2, 250.0), "StudentT with nu 250.0"),
    ("truncation", float("nan"), "at nan"),
    ("truncation", -1.0, "TruncatedGaussian at -1.0"),
    ("major", 2, "format 2.0"), ("columns", 5, "5 columns in the file"),
    ("rows", 0xFFFFFFFF, "too many"), ("rows", 7, "block size"),
    ("antennas", 0x7FFFFFFF, "too many"), ("antennas", 5, "header"),
    ("block", 12345, "block size 12345"), ("header_size", 1 << 30, "header of"),
    ("column_at", 1 << 20, "column headers at"), ("name_length", 1 << 31, "name of"),
    ("column_header_size", 3, "column header of 3 bytes")])
def test_hostile_headers_are_refused_in_one_line(small, tmp_path, field, value, message):
    path, name = damaged_copy(small, tmp_path, field, value)
    table = open_table(TableDirectory(path), path)
    for column in ("DATA", "WEIGHT_SPECTRUM"):
        with pytest.raises(FormatError, match=message) as caught:
            table.read_column(column)
        text = str(caught.value)
        assert name in text and "\n" not in text
    table.read_column("TIME")  # the other managers' columns read as before


def test_truncated_blocks_read_as_casacore_reads_them(small, tmp_path):
    """A block cut short by the file's end is past the blocks the file holds: zeros, as
    casacore gives; the blocks before it decode."""
    table = open_table(TableDirectory(small), small)
    reader = table._reader(table.columns["DATA"].seqnr)
    cut = reader.header_size + 2 * reader.block_size + reader.block_size // 2
    path, _ = damaged_copy(small, tmp_path, size=cut)
    table = open_table(TableDirectory(path), path)
    with ct.table(path, ack=False) as ref:
        for name in ("DATA", "WEIGHT_SPECTRUM"):
            expected = ref.getcol(name)
            assert not expected[20:].any() and expected[:20].any()
            assert_bit_exact(table.read_column(name), expected, name)


def test_rows_of_an_antenna_outside_the_block_are_eio_only_there(small, tmp_path, mount):
    path = tmp_path / "a.ms"
    shutil.copytree(small, path)
    with ct.table(str(path), readonly=False, ack=False) as t:
        t.putcell("ANTENNA2", 25, 9)
    table = open_table(TableDirectory(str(path)), str(path))
    with pytest.raises(FormatError, match="ANTENNA2 of rows 20..30 is not an antenna"):
        table.read_column("DATA", 20, 30)
    with ct.table(small, ack=False) as ref:
        assert_bit_exact(table.read_column("DATA", 0, 20), ref.getcol("DATA", 0, 20), "DATA")
        assert_bit_exact(table.read_column("WEIGHT_SPECTRUM"), ref.getcol("WEIGHT_SPECTRUM"),
                         "weights need no antennas")
    m = mount(str(path), ["columns"])
    with open(m.mountpoint / "columns" / "DATA.npy", "rb") as f:
        head = f.read(128)
        assert head.startswith(b"\x93NUMPY")
        with pytest.raises(OSError) as caught:
            f.read()
        assert caught.value.errno == 5
    assert "Traceback" not in m.log_text()
    np.load(io.BytesIO((m.mountpoint / "columns" / "WEIGHT_SPECTRUM.npy").read_bytes()))
