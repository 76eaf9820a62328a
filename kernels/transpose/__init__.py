"""Transpose kernels.  Importing this package imports no TileLang; only the op modules do."""
