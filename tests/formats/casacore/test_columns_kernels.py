"""The compiled kernels of the Dysco and Sisco decoders check every index they compute:
numba does not, so an array too short, a size that does not fit or a key out of range
would otherwise read or write past an array's end (garbage or a crash). Each kernel
refuses (False, nothing written) every size that does not fit; whatever bytes a file
holds give values, EIO or a one-line refusal through the VFS, never a crash; a mount
of a table without those managers does not import numba; and the kernels' cache is
never a directory another user could write."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import casacore.tables as ct
import numpy as np
import pytest

from ctdsfs.formats.casacore import compiled, dysco_kernels, sisco_predict
from ctdsfs.formats.casacore.sisco import LEVELS

from .test_columns import mutated
from .test_columns_dysco import dysco_columns, small, write_ms  # noqa: F401 (a fixture)
from .test_columns_hostile import _everything_through_the_vfs

CHANNELS, POLS, ROWS, BITS = 3, 2, 4, 10


def dysco_arrays():
    """Arrays that fit: ROWS rows of CHANNELS x POLS, BITS bits, the symbols from bit 3."""
    values = ROWS * CHANNELS * POLS * 2
    rng = np.random.default_rng(1)
    return {"raw": rng.integers(0, 256, (3 + values * BITS + 15) // 8, dtype=np.uint8),
            "bit": 3, "bits": BITS, "table": rng.normal(size=1 << BITS),
            "channel_factors": rng.uniform(size=CHANNELS * POLS),
            "row_factors": rng.uniform(size=ROWS * POLS), "channels": CHANNELS, "pols": POLS,
            "out": np.zeros(values, np.float32)}


def data_call(args):
    return dysco_kernels.data_values(*(args[k] for k in (
        "raw", "bit", "bits", "table", "channel_factors", "row_factors", "channels", "pols",
        "out")))


def weight_call(args):
    return dysco_kernels.weight_values(*(args[k] for k in (
        "raw", "bit", "bits", "scale", "channels", "pols", "out")))


def shorter(array):
    return array[:-1]


DATA_MISFITS = {"raw one byte short": ("raw", shorter), "bit 8": ("bit", lambda b: 8),
                "bit -1": ("bit", lambda b: -1), "17 bits": ("bits", lambda b: 17),
                "more bits than the table": ("bits", lambda b: b + 1),
                "table short": ("table", shorter), "channel factors short":
                ("channel_factors", shorter), "row factors not whole rows":
                ("row_factors", shorter), "no channels": ("channels", lambda c: 0),
                "more channels": ("channels", lambda c: c + 1), "no pols": ("pols", lambda p: 0),
                "out short": ("out", shorter), "out long":
                ("out", lambda o: np.zeros(o.size + 1, np.float32))}


WEIGHT_MISFITS = {"raw too short": ("raw", lambda r: r[:(3 + ROWS * CHANNELS * BITS) // 8]),
                  "bit 8": ("bit", lambda b: 8), "no channels": ("channels", lambda c: 0),
                  "more channels": ("channels", lambda c: c + 7), "no pols": ("pols", lambda p: 0),
                  "out not whole rows": ("out", shorter)}




def weight_arrays():
    args = dysco_arrays()
    args.update(scale=0.5, out=np.zeros(ROWS * CHANNELS * POLS, np.float32))
    return args


KERNELS = {"data": (dysco_arrays, data_call, DATA_MISFITS),
           "weight": (weight_arrays, weight_call, WEIGHT_MISFITS)}


@pytest.mark.parametrize("kernel, misfit", [(k, m) for k, (_, _, misfits) in KERNELS.items()
                                            for m in misfits])
def test_dysco_kernels_refuse_every_size_that_does_not_fit(kernel, misfit):
    arrays, call, misfits = KERNELS[kernel]
    args = arrays()
    assert call(args) and args["out"].any()
    key, change = misfits[misfit]
    args = arrays()
    args[key] = change(args[key])
    assert not call(args)
    assert not args["out"].any()


SISCO_CHANNELS, ITEMS, KEYS = 5, 6, 4


def sisco_arrays(level=2, width=5, planes=None):
    """ITEMS items (two parts each) from value 2 of a chunk of random bytes, in the types
    the reader passes (read-only planes, contiguous arrays): another type would compile
    the kernel anew."""
    values = 2 + ITEMS * 2 * SISCO_CHANNELS + 3
    along_channels, along_time = LEVELS[level]
    rng = np.random.default_rng(level + 100)
    keys = rng.integers(0, KEYS, 2 * ITEMS).astype(np.int64)
    if planes is None:
        planes = rng.integers(0, 256, width * values, dtype=np.uint8)
        planes.flags.writeable = False
    return {"plain": planes, "values": values, "used": 2, "count": ITEMS,
            "channels": SISCO_CHANNELS, "keys": keys,
            "history": np.zeros((KEYS, along_time[0], 3, SISCO_CHANNELS), np.int64),
            "held": np.zeros(KEYS, np.int64), "along_channels": along_channels,
            "along_time": along_time,
            "out": np.zeros(2 * ITEMS * SISCO_CHANNELS, np.uint32)}


def sisco_call(args):
    return sisco_predict.decode_items(*(args[k] for k in (
        "plain", "values", "used", "count", "channels", "keys", "history", "held",
        "along_channels", "along_time", "out")))


SISCO_MISFITS = {
    "planes not whole values": ("plain", shorter),
    "planes of 3 bytes a value": ("plain", lambda p: p[:3 * (p.size // 5)]),
    "no values": ("values", lambda v: 0), "past the chunk": ("used", lambda u: u + 4),
    "used -1": ("used", lambda u: -1), "count past the chunk": ("count", lambda c: c + 1),
    "no channels": ("channels", lambda c: 0), "a key -1": ("keys", lambda k: k - 1),
    "a key past the history": ("keys", lambda k: k + 1),
    "keys short": ("keys", shorter), "out short": ("out", shorter),
    "history of other keys": ("history", lambda h: h[1:]),
    "history of other channels": ("history", lambda h: np.zeros(h.shape[:3] + (SISCO_CHANNELS - 1,), np.int64)),
    "history of another depth": ("history", lambda h: np.zeros((KEYS, 4, 3, SISCO_CHANNELS),
                                                               np.int64)),
    "5 values along the channels": ("along_channels", lambda a: (5, False)),
}


@pytest.mark.parametrize("misfit", SISCO_MISFITS)
def test_sisco_kernel_refuses_every_size_or_key_that_does_not_fit(misfit):
    args = sisco_arrays()
    assert sisco_call(args) and args["out"].any()
    key, change = SISCO_MISFITS[misfit]
    args = sisco_arrays()
    if key == "keys" and misfit != "keys short":
        args["keys"][0] = KEYS - 1 if "past" in misfit else 0
    args[key] = change(args[key])
    assert not sisco_call(args)
    assert not args["out"].any() and not args["held"].any()


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_sisco_kernel_decodes_any_bytes(level):
    """Random planes (every exponent among them, -127 and -128 too), at every level:
    values, deterministic, and each key's history filled as far as its depth."""
    width = 4 if level == -1 else 5
    first = sisco_arrays(level, width)
    assert sisco_call(first)
    again = sisco_arrays(level, width, first["plain"])
    assert sisco_call(again) and np.array_equal(first["out"], again["out"])
    counts = np.bincount(first["keys"], minlength=KEYS)
    assert np.array_equal(first["held"], np.minimum(counts, LEVELS[level][1][0]))


def test_hostile_dysco_files(small, tmp_path):  # noqa: F811
    """Bytes overwritten in the header and anywhere in the blocks (factors, symbols):
    every file of columns/ reads as values, EIO or a one-line refusal; restored, as
    before."""
    path = tmp_path / "d.ms"
    shutil.copytree(small, path)
    with ct.table(str(path), ack=False) as t:
        files = sorted({f"table.f{t.getdminfo(c)['SEQNR']}" for c in dysco_columns(str(path))})
    intact = _everything_through_the_vfs(str(path))
    assert intact == 0
    failed = 0
    for _ in mutated(str(path), files, np.random.default_rng(5), (6, 10),
                     (b"\xff\xff\xff\x7f", b"\x00\x00\x80\xff", b"\x07")):
        failed += _everything_through_the_vfs(str(path)) - intact
    assert failed > 0
    assert _everything_through_the_vfs(str(path)) == intact


def test_numba_is_imported_only_for_the_managers_that_need_it(tmp_path, small):  # noqa: F811
    """A table without Dysco or Sisco columns opens and reads without importing numba; a
    Dysco column's reader imports it."""
    plain = write_ms(tmp_path / "plain.ms", {"managers": []})
    check = """
import sys
from ctdsfs.formats.casacore.base import TableDirectory
from ctdsfs.formats.casacore.columns import open_table
table = open_table(TableDirectory(sys.argv[1]))
for name in table.columns:
    table.read_column(name)
print("numba" in sys.modules)
"""
    for path, expected in ((plain, "False"), (small, "True")):
        done = subprocess.run([sys.executable, "-c", check, str(path)], check=True,
                              capture_output=True, text=True)
        assert done.stdout.strip() == expected, path


def test_the_temporary_cache_is_the_users_alone(tmp_path, monkeypatch):
    """Where neither the package's directory nor the user's cache is writable, the kernels
    cache in a directory of the temporary directory made for the user alone; one open to
    others, or a link, or a file, is not used (numba's cache holds pickles)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = compiled._temporary_cache()
    assert path == str(tmp_path / f"ctdsfs-numba-{os.getuid()}")
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    assert compiled._temporary_cache() == path
    os.chmod(path, 0o777)
    assert compiled._temporary_cache() is None
    os.rmdir(path)
    os.symlink(tmp_path, path)
    assert compiled._temporary_cache() is None
    os.unlink(path)
    Path(path).write_bytes(b"")
    assert compiled._temporary_cache() is None


def test_warming_the_decoders_loads_the_kernels_and_starts_no_thread(small):  # noqa: F811
    """A mount's daemon warms the decoders and then forks: a thread started by the warm-up
    would be missing in the children, and what waited for it would wait for good."""
    import threading

    from ctdsfs.formats.casacore.base import TableDirectory
    from ctdsfs.formats.casacore.columns import open_table

    table = open_table(TableDirectory(small))
    threads = threading.active_count()
    table.warm_decoders()
    assert threading.active_count() == threads
    assert table._readers  # (the Dysco reader, made and warmed)
