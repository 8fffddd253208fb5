"""StandardStMan tables after python-casacore's ``removecols``: casacore moves the later
columns' entries of its DM info down and keeps the blocks' length, so the info names more
columns than table.dat binds; every column left must still read as casacore reads it."""

import casacore.tables as ct
import pytest

from .casacore_column_tables import strings, values
from .test_columns import assert_same_as_casacore

NROW = 300  # several buckets per column

COLUMNS = {  # name -> (description, values)
    "s_int": (ct.makescacoldesc("s_int", 0), values("int", NROW, 1)),
    "s_double": (ct.makescacoldesc("s_double", 0.0), values("double", NROW, 2)),
    "a_bool": (ct.makearrcoldesc("a_bool", False, ndim=2, shape=[3, 4]),
               values("bool", (NROW, 3, 4), 3)),
    "s_string": (ct.makescacoldesc("s_string", ""), strings(NROW, 4)),
    "v_double": (ct.makearrcoldesc("v_double", 0.0, ndim=1), values("double", (NROW, 5), 5)),
    "a_complex": (ct.makearrcoldesc("a_complex", 0j, ndim=1, shape=[2],
                                    valuetype="complex"), values("complex", (NROW, 2), 6)),
    "s_bool": (ct.makescacoldesc("s_bool", False), values("bool", NROW, 7)),
}


@pytest.mark.parametrize("removed", [["s_int"], ["a_bool"], ["s_bool"],
                                     ["s_string", "v_double"], ["s_double", "a_complex"],
                                     ["s_int", "a_bool", "s_bool"]],
                         ids=lambda r: "+".join(r))
def test_columns_left_after_removecols_read_as_casacore(tmp_path, removed):
    path = str(tmp_path / "t")
    desc = ct.maketabdesc([d for d, _ in COLUMNS.values()])
    with ct.table(path, desc, nrow=NROW, ack=False) as table:
        for name, (_, cells) in COLUMNS.items():
            table.putcol(name, cells)
        table.removecols(removed)
    table, checked = assert_same_as_casacore(path)
    assert sorted(table.columns) == sorted(set(COLUMNS) - set(removed))
    assert checked == len(COLUMNS) - len(removed)
