"""Float64 tree attention in plain PyTorch: the ground truth the kernel is tested against."""

import math

import torch


def tree_attention_reference(
    q: torch.Tensor,  # q: [B, Hq, T, D]
    k: torch.Tensor,  # k: [B, Hkv, S, D], the last T positions are the tree nodes
    v: torch.Tensor,  # v: [B, Hkv, S, D]
    tree_mask: torch.Tensor,  # tree_mask: [B, T, T] bool, True where node j is an ancestor of node i
    scale: float | None = None,
) -> torch.Tensor:  # out: [B, Hq, T, D] float64
    """Attend every node to the whole prefix, its ancestors and itself, computed densely in float64."""
    batch, q_heads, nodes, head_dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    groups = q_heads // kv_heads
    k64 = k.double().repeat_interleave(groups, dim=1)
    v64 = v.double().repeat_interleave(groups, dim=1)
    allowed = torch.ones(batch, nodes, seq, dtype=torch.bool, device=q.device)
    eye = torch.eye(nodes, dtype=torch.bool, device=q.device)
    allowed[:, :, seq - nodes :] = tree_mask | eye
    scores = (q.double() @ k64.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64
