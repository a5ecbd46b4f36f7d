"""Triton kernels for verification: tree attention and its transformers integration.

This folder is packaged as graft_lab.kernels. Run from the repository root (`python -m pytest` puts it on
sys.path) it is also findable as a top-level `kernels`, a name transformers probes for the Hugging Face
package; under that name it imports nothing, so transformers finds no version and leaves it alone.
"""

if __name__ == "graft_lab.kernels":
    from .hf_attention import ATTENTION_NAME, graft_tree_attention, register_tree_attention
    from .reference import tree_attention_reference
    from .tree_attention_kernel import tree_attention
    from .tree_mask import TreeMaskBits, pack_tree_mask

    __all__ = [
        "ATTENTION_NAME",
        "TreeMaskBits",
        "graft_tree_attention",
        "pack_tree_mask",
        "register_tree_attention",
        "tree_attention",
        "tree_attention_reference",
    ]
