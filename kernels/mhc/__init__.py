"""mHC hyper-connection kernels (``tilebin.modeling.mhc``): expand, pre-norm fn, split mixes,
Sinkhorn, apply mix, post, head mix, the fused pre path and multilayer recompute.

``kernels/modules.py`` lists every ``<name>.py`` here (no shared list to edit)."""
