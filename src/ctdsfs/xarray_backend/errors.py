"""The exceptions and warnings the backend raises, named as xarray-ms names them, so that
code written against xarray-ms catches the same kinds (the classes are ctdsfs's own)."""


class IrregularGridWarning(UserWarning):
    """The MS rows do not fill a regular grid."""


class IrregularTimeGridWarning(IrregularGridWarning):
    """Intervals differ within a partition."""


class IrregularBaselineGridWarning(IrregularGridWarning):
    """(time, baseline) cells without a row: filled with NaN, flagged."""


class IrregularChannelGridWarning(IrregularGridWarning):
    """Channel widths differ within a spectral window."""


class MissingMetadataWarning(UserWarning):
    """A subtable lacks rows the main table refers to."""


class ImputedMetadataWarning(MissingMetadataWarning):
    """Rows made up for a subtable that lacks them."""


class ColumnShapeImputationWarning(UserWarning):
    """An extra column left out: its cells have no single shape."""


class DuplicateAntennaNameWarning(UserWarning):
    """ANTENNA names repeat: suffixes make them unique."""


class HeterogeneousFeedWarning(UserWarning):
    """An antenna's FEED rows differ: the first is used."""


class FrameConversionWarning(UserWarning):
    """A measures frame with no MSv4 name, or replaced."""


class InvalidMeasurementSet(ValueError):
    """The MS breaks a rule of the format."""


class ComplexMeasurementSet(ValueError):
    """Measures that refer to other columns in a way not followed."""


class InvalidPartitionKey(ValueError):
    """A partition key that names no partition column or value."""


class PartitioningError(ValueError):
    """The partition has no unique (time, baseline) grid."""


class MissingMeasuresInfo(ValueError):
    """A column's MEASINFO lacks a field the measure needs."""


class MultipleQuantumUnits(ValueError):
    """A column names more than one unit."""


class IrregularSubtableGridWarning(IrregularGridWarning):
    """A subtable's (time, antenna) grid has cells without a row."""


class DuplicateSubtableRowWarning(UserWarning):
    """A subtable repeats a (TIME, ANTENNA_ID): no grid, so no dataset from it."""
