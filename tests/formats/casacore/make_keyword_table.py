"""A table whose keywords use every kind of value a TableRecord holds, plus a subtable.

Run with python-casacore 3.8 (PyPI) or Debian's casacore 3.5 (/usr/bin/python3),
so the table.dat codec meets both writers. Usage: python3 make_keyword_table.py NAME
"""
import sys

import casacore.tables as t
import numpy as np

name = sys.argv[1]
td = t.maketabdesc([t.makescacoldesc('I', 0, comment='an int'), t.makescacoldesc('C', 0j), t.makescacoldesc('B', True), t.makescacoldesc('S', 'dflt'), t.makearrcoldesc('A', 0., ndim=2), t.makearrcoldesc('F', 0., shape=[3])])
tb = t.table(name, td, nrow=3, ack=False)
kws = {'b': True, 'i': -5, 'f': 1.5, 'c': 1+2j, 's': 'str', 'ai': np.arange(6, dtype=np.int32).reshape(2,3), 'ad': np.arange(3.), 'ab': np.array([True, False, True, True, False, False, False, False, True]), 'as': np.array(['x','yy']), 'ac': np.array([1j, 2]), 'rec': {'nested': {'deep': 1, 'arr': np.arange(2.)}, 'x': 'y'}, 'empty': {}, 'i64': 2**40}
for k, v in kws.items(): tb.putkeyword(k, v)
tb.putcolkeyword('I', 'UNIT', 'm'); tb.putcolkeyword('A', 'MEASINFO', {'type': 'epoch', 'Ref': 'UTC'})
sub = t.table(name + '/SUB', t.maketabdesc([t.makescacoldesc('X', 0)]), nrow=1, ack=False)
tb.putkeyword('SUB', sub); sub.close(); tb.close()
