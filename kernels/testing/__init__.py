"""Test kernels that exercise runtime paths (cooperative launch, PDL, several launches).

Importing this package imports no TileLang; only the op modules do.
"""
