// Writes a small casacore table whose data columns are bound to TiledDataStMan, the
// tiled manager whose hypercubes only a C++ program can add (python-casacore has no
// TiledDataStManAccessor). Usage: make_tiled_data_table PATH uniform|mixed little|big
// plain|multifile
//   uniform: DATA (Complex) and FLAG (Bool), fixed cells [4,6], hypercolumn of rank 3;
//            cube 0 extensible (own file) holds rows 0-9 and 30-39, cube 1 rows 10-29,
//            cube 2 rows 40-44; tiles [2,4,3] leave partial edge tiles.
//   mixed:   DATA (Float) and FLAG (Bool), cells of varying shape, hypercolumn of rank 4
//            (two row axes: a row walks the third axis, then the fourth); cube 0
//            extensible with cells [2,3] (rows 0-7 and 14-25), cube 1 cells [3,2] (8-13);
//            rows 26-27 in no cube (casacore refuses to read them).
// Each data cell holds row * 1000 + its element index (Fortran order); a FLAG element is
// set where (row + element index) % 3 == 0.
// The hypercubes' value records: id columns ID (Int) and NAME (String, non-ASCII; a
// cube's ids: the values given when it is added or extended), coordinate columns
//   uniform: FREQ (Double vector, axis 0: given when cube 1 is added, zeros elsewhere)
//            and TIME (Double scalar, axis 2: given in the extension of cube 0, put per
//            row in cube 1, zeros in cube 2);
//   mixed:   CHAN (Int vector, axis 1: given for cube 0), BASELINE (Int scalar, axis 2:
//            given for cube 0) and TIME (Double scalar, axis 3: put per row, so rows at
//            one position of the fourth axis share the last value put).
#include <casacore/casa/Arrays/ArrayMath.h>
#include <casacore/casa/Containers/Record.h>
#include <casacore/tables/DataMan/TiledDataStMan.h>
#include <casacore/tables/DataMan/TiledDataStManAccessor.h>
#include <casacore/tables/Tables/ArrColDesc.h>
#include <casacore/tables/Tables/ArrayColumn.h>
#include <casacore/tables/Tables/ScaColDesc.h>
#include <casacore/tables/Tables/ScalarColumn.h>
#include <casacore/tables/Tables/SetupNewTab.h>
#include <casacore/tables/Tables/StorageOption.h>
#include <casacore/tables/Tables/Table.h>
#include <casacore/tables/Tables/TableDesc.h>
#include <cstring>
#include <iostream>

using namespace casacore;

template <typename T>
static void fill(Table& table, uInt row, const IPosition& shape) {
    Array<T> data(shape);
    Array<Bool> flag(shape);
    size_t n = 0;
    for (auto it = data.begin(); it != data.end(); ++it, ++n) *it = T(row * 1000.0 + n);
    n = 0;
    for (auto it = flag.begin(); it != flag.end(); ++it, ++n) *it = (row + n) % 3 == 0;
    ArrayColumn<T>(table, "DATA").put(row, data);
    ArrayColumn<Bool>(table, "FLAG").put(row, flag);
}

static Record cube_id(Int id) {
    Record values;
    values.define("ID", id);
    values.define("NAME", String(id == 1 ? "cube \xc3\xa9t\xc3\xa9" : "cube ") +
                              String::toString(id));
    return values;
}

template <typename T>
static Vector<T> ramp(uInt n, T first) {
    Vector<T> values(n);
    for (uInt i = 0; i < n; i++) values(i) = first + T(i);
    return values;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        std::cerr << "usage: make_tiled_data_table PATH uniform|mixed little|big "
                     "plain|multifile\n";
        return 2;
    }
    const bool uniform = std::strcmp(argv[2], "uniform") == 0;
    const Table::EndianFormat endian =
        std::strcmp(argv[3], "big") == 0 ? Table::BigEndian : Table::LittleEndian;
    const StorageOption storage(std::strcmp(argv[4], "multifile") == 0
                                    ? StorageOption::MultiFile : StorageOption::SepFile,
                                4096);  // MultiFile blocks of 4 KiB: a small table.mf
    TableDesc desc("", "1", TableDesc::Scratch);
    if (uniform) {
        desc.addColumn(ArrayColumnDesc<Complex>("DATA", IPosition(2, 4, 6),
                                                ColumnDesc::FixedShape));
        desc.addColumn(ArrayColumnDesc<Bool>("FLAG", IPosition(2, 4, 6),
                                             ColumnDesc::FixedShape));
    } else {
        desc.addColumn(ArrayColumnDesc<Float>("DATA", 2));
        desc.addColumn(ArrayColumnDesc<Bool>("FLAG", 2));
    }
    desc.addColumn(ScalarColumnDesc<Int>("ID"));
    desc.addColumn(ScalarColumnDesc<String>("NAME"));
    desc.addColumn(ScalarColumnDesc<Double>("TIME"));
    Vector<String> data(2), ids(2), coords(uniform ? 3 : 4);
    data(0) = "DATA"; data(1) = "FLAG"; ids(0) = "ID"; ids(1) = "NAME";
    if (uniform) {
        desc.addColumn(ArrayColumnDesc<Double>("FREQ", 1));
        coords(0) = "FREQ"; coords(2) = "TIME";
    } else {
        desc.addColumn(ArrayColumnDesc<Int>("CHAN", 1));
        desc.addColumn(ScalarColumnDesc<Int>("BASELINE"));
        coords(1) = "CHAN"; coords(2) = "BASELINE"; coords(3) = "TIME";
    }
    desc.defineHypercolumn("TDS", uniform ? 3 : 4, data, coords, ids);
    SetupNewTable setup(argv[1], desc, Table::New, storage);
    TiledDataStMan manager("TDS");
    setup.bindAll(manager);
    Table table(setup, uniform ? 45 : 28, False, endian);
    TiledDataStManAccessor accessor(table, "TDS");
    ScalarColumn<Double> time(table, "TIME");
    if (uniform) {
        const IPosition tile(3, 2, 4, 3);
        accessor.addHypercube(IPosition(3, 4, 6, 0), tile, cube_id(0));
        accessor.extendHypercube(10, cube_id(0));
        Record second = cube_id(1);
        second.define("FREQ", ramp<Double>(4, 1.4e9));
        accessor.addHypercube(IPosition(3, 4, 6, 20), tile, second);
        Record extension = cube_id(0);
        extension.define("TIME", ramp<Double>(10, 5.0e9));
        accessor.extendHypercube(10, extension);
        accessor.addHypercube(IPosition(3, 4, 6, 5), tile, cube_id(2));
        for (uInt row = 0; row < 45; row++) fill<Complex>(table, row, IPosition(2, 4, 6));
        for (uInt row = 10; row < 30; row++) time.put(row, 4.0e9 + row * 0.5);
    } else {
        Record first = cube_id(0);
        first.define("CHAN", ramp<Int>(3, 100));
        first.define("BASELINE", ramp<Int>(4, -2));
        accessor.addHypercube(IPosition(4, 2, 3, 4, 0), IPosition(4, 2, 2, 3, 1), first);
        accessor.extendHypercube(2, cube_id(0));
        accessor.addHypercube(IPosition(4, 3, 2, 3, 2), IPosition(4, 2, 2, 2, 2), cube_id(1));
        accessor.extendHypercube(3, cube_id(0));
        for (uInt row = 0; row < 26; row++) {
            fill<Float>(table, row, row >= 8 && row < 14 ? IPosition(2, 3, 2)
                                                            : IPosition(2, 2, 3));
            time.put(row, 7.0e9 + row);
        }
    }
    return 0;
}
