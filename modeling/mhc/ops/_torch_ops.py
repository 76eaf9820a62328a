"""``tilebin::<op>`` declarations of the mHC ops (see ``ops/_torch.py``): each op module declares its
``TORCH_OPS`` beside its OpSpecs (forward and backward ops, ``<op>_out`` where ``out=`` is taken);
this module gathers them for ``register_all``."""

from __future__ import annotations

from . import (expand, head_compute_mix, multilayer_recompute, norm_fn, post, pre_apply_mix, pre_big_fuse,
               pre_split_mixes, sinkhorn)

MODULES = (expand, head_compute_mix, multilayer_recompute, norm_fn, post, pre_apply_mix, pre_big_fuse,
           pre_split_mixes, sinkhorn)
TORCH_OPS = tuple(op for module in MODULES for op in module.TORCH_OPS)
