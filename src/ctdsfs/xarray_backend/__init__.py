"""MeasurementSets as xarray DataTrees without casacore: the ``ctdsfs`` xarray engine.

    import xarray as xr
    dt = xr.open_datatree("s3://bucket/obs.mf", engine="ctdsfs",
                          storage_options={"endpoint_url": "http://127.0.0.1:8333"})

It gives the tree xarray-ms (``engine="xarray-ms:msv2"``) gives for the same MS, read
through ctdsfs's decoders from any source ctdsfs opens (see docs/xarray.md). Needs the
``xarray`` extra (``pip install "ctdsfs[xarray]"``).
"""

from .entrypoint import CtdsfsBackendEntrypoint

__all__ = ["CtdsfsBackendEntrypoint"]
