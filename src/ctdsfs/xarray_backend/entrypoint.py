"""The ``ctdsfs`` xarray engine: ``xr.open_datatree(source, engine="ctdsfs")`` and
``xr.open_dataset(source, engine="ctdsfs", partition_key=...)``."""

import os
import warnings
from datetime import datetime, timezone

from xarray import DataTree
from xarray.backends import BackendEntrypoint
from xarray.backends.common import AbstractDataStore
from xarray.backends.store import StoreBackendEntrypoint

from .. import __version__
from .correlated import CorrelatedVariables
from .errors import FrameConversionWarning
from .gridded import (
    phased_array_dataset,
    pointing_dataset,
    system_calibration_dataset,
    weather_dataset,
)
from .structure import Structure
from .subtables import antenna_dataset, field_and_source_dataset, select_antennas
from .tables import MSTables, ms_name


class MSStore(AbstractDataStore):
    """One partition of an MS as an xarray data store."""

    def __init__(self, tables, structure, key, preferred_chunks):
        self.correlated = CorrelatedVariables(tables, structure, key, preferred_chunks)

    def get_variables(self):
        return self.correlated.variables()

    def get_attrs(self):
        attrs = {"schema_version": "4.0.0",
                 "creation_date": datetime.now(timezone.utc).isoformat(),
                 "type": "visibility",
                 "creator": {"software_name": "ctdsfs", "version": __version__},
                 **self.correlated.attrs()}
        return dict(sorted(attrs.items()))

    def get_dimensions(self):
        return None

    def get_encoding(self):
        return {}

    def close(self):
        """The tables stay open for the process (shared by its datasets)."""


INTERPOLATED = ("pointing", "sys_cal", "weather")  # the ``interpolate`` option's names


def _interpolated(interpolate):
    """The datasets ``interpolate`` names (one name or several) as a set."""
    names = set() if interpolate is None else \
        {interpolate} if isinstance(interpolate, str) else set(interpolate)
    if names - set(INTERPOLATED):
        raise ValueError(f"Invalid interpolate values {sorted(names - set(INTERPOLATED))}. "
                         f"Valid values are {list(INTERPOLATED)}")
    return names


def _source(filename_or_obj):
    if isinstance(filename_or_obj, os.PathLike):
        return os.fspath(filename_or_obj)
    if not isinstance(filename_or_obj, str):
        raise ValueError("Measurement Set paths must be strings")
    return filename_or_obj


def _chunks_for(structure, preferred_chunks):
    """{partition key: preferred chunks}: one dict for all, or per (partial) key."""
    if not preferred_chunks:
        return {k: {} for k in structure.keys()}
    try:
        keyed = [(structure.resolve_key(k), v) for k, v in preferred_chunks.items()]
    except (ValueError, TypeError, AttributeError):
        return {k: preferred_chunks for k in structure.keys()}
    out = {k: {} for k in structure.keys()}
    out.update((k, v) for keys, v in keyed for k in keys)
    return out


class CtdsfsBackendEntrypoint(BackendEntrypoint):
    """MSv2 MeasurementSets as MSv4 datasets, read by ctdsfs without casacore."""

    description = "MSv2 MeasurementSets from any ctdsfs source, as xarray-ms shows them"
    url = "https://github.com/ctdsfs/ctdsfs/blob/main/docs/xarray.md"
    open_dataset_parameters = ["filename_or_obj", "drop_variables", "partition_schema",
                               "partition_key", "preferred_chunks", "auto_corrs",
                               "storage_options"]
    supports_groups = True

    def guess_can_open(self, filename_or_obj):
        """Only when asked for by name (xarray-ms claims local MS directories)."""
        return False

    def open_dataset(self, filename_or_obj, *, drop_variables=None, partition_schema=None,
                     partition_key=None, preferred_chunks=None, auto_corrs=False,
                     storage_options=None, structure=None):
        tables = MSTables(_source(filename_or_obj), storage_options)
        structure = structure or Structure(tables, partition_schema, auto_corrs)
        keys = structure.resolve_key(partition_key)
        if not keys:
            raise ValueError(f"{partition_key} not in {structure.keys()}")
        if len(keys) > 1 and partition_key:
            warnings.warn(f"{partition_key} matched multiple partitions. Selected {keys[0]}",
                          stacklevel=2)
        store = MSStore(tables, structure, keys[0], preferred_chunks)
        return StoreBackendEntrypoint().open_dataset(store, drop_variables=drop_variables)

    def open_datatree(self, filename_or_obj, *, drop_variables=None, partition_schema=None,
                      preferred_chunks=None, auto_corrs=False, storage_options=None,
                      interpolate=None):
        groups = self.open_groups_as_dict(
            filename_or_obj, drop_variables=drop_variables, partition_schema=partition_schema,
            preferred_chunks=preferred_chunks, auto_corrs=auto_corrs,
            storage_options=storage_options, interpolate=interpolate)
        return DataTree.from_dict(groups)

    def open_groups_as_dict(self, filename_or_obj, *, drop_variables=None,
                            partition_schema=None, preferred_chunks=None, auto_corrs=False,
                            storage_options=None, interpolate=None):
        interpolate = _interpolated(interpolate)
        source = _source(filename_or_obj)
        tables = MSTables(source, storage_options)
        structure = Structure(tables, partition_schema, auto_corrs)
        chunks = _chunks_for(structure, preferred_chunks)
        name = ms_name(source)
        groups = {}
        for number, key in enumerate(structure.keys()):
            path = f"{name}_partition_{number:03}"
            ds = self.open_dataset(source, drop_variables=drop_variables,
                                   partition_schema=partition_schema, partition_key=key,
                                   preferred_chunks=chunks[key], auto_corrs=auto_corrs,
                                   storage_options=storage_options, structure=structure)
            partition = structure[key]
            selection = select_antennas(tables.subtable("ANTENNA"), tables.subtable("FEED"),
                                        partition)
            groups[path] = ds
            antennas = groups[f"{path}/antenna_xds"] = antenna_dataset(tables, partition,
                                                                        selection)
            for node, made in (
                    ("phased_array_xds", phased_array_dataset(tables, *selection[1:],
                                                              antennas)),
                    ("pointing_xds", pointing_dataset(tables, partition, *selection[1:],
                                                      "pointing" in interpolate)),
                    ("system_calibration_xds", system_calibration_dataset(
                        tables, partition, *selection[1:], antennas, "sys_cal" in interpolate)),
                    ("weather_xds", weather_dataset(tables, partition, selection[1], antennas,
                                                    "weather" in interpolate))):
                if made is not None:
                    groups[f"{path}/{node}"] = made
            fields = field_and_source_dataset(tables, partition)
            groups[f"{path}/field_and_source_base_xds"] = fields
            ds.attrs["data_groups"] = {"base": {
                "correlated_data": "VISIBILITY",
                "description": "Data group associated with the VISIBILITY DataArray",
                "date": datetime.now(timezone.utc).isoformat(),
                "field_and_source": f"{path}/field_and_source_base_xds",
                "uvw": "UVW", "flag": "FLAG", "weight": "WEIGHT"}}
            _uvw_frame(ds, fields)
        return groups


def _uvw_frame(ds, fields):
    """ITRF is no MSv4 UVW frame: the field's phase centre frame replaces it (as xarray-ms)."""
    if ds.UVW.attrs.get("frame") != "ITRF":
        return
    frame = fields.FIELD_PHASE_CENTER_DIRECTION.attrs["frame"]
    warnings.warn(f"UVW coordinate frame was set to ITRF which is an unsupported MSv4 frame "
                  f"for UVW. Setting the frame to {frame} from the "
                  f"FIELD_PHASE_CENTER_DIRECTION of the field associated with this dataset. "
                  f"See https://github.com/casangi/xradio/issues/476", FrameConversionWarning,
                  stacklevel=3)
    ds.UVW.attrs["frame"] = frame
