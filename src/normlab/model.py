"""A GPT you can read top to bottom (after nanoGPT), with every norm built by ``norms.build_norm``.

Shapes: B batch, T sequence length (<= context_length), C = d_model, H heads, V vocabulary.
Token + learned position embeddings, causal ``F.scaled_dot_product_attention``, a GELU MLP (4C
hidden), a final norm and a head tied to the token embedding. Init as GPT-2 (Radford et al. 2019):
N(0, 0.02) weights, residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases, gains 1.
Each norm is ``build_norm(norm.at(position, block))``; ``Block.forward`` writes out every
``norm.placement``; a model whose last block is post or deepnorm has no final norm.

Why: docs/norms.md
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from normlab.config import ConfigError, ModelConfig, NormConfig, Placement, QKNorm
from normlab.norms import build_norm

#: Added to the seed of each norm gate's generator (``GPT._init_gates``), away from small seeds.
GATE_SEED_OFFSET = 0x6A7E


def _norm(norm: NormConfig, position: str, block: int | None, size: int) -> nn.Module:
    """The norm at ``position`` (of block ``block``) over ``size`` features."""
    cfg = norm.at(position, block)
    try:
        return build_norm(cfg, size)
    except ConfigError as e:
        where = position if block is None else f"block {block} {position}"
        raise ConfigError(f"the {where} norm ({cfg.kind.name}): {e}") from None


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, optional QK-norm: ``(B, T, C) -> (B, T, C)``."""

    def __init__(self, cfg: ModelConfig, norm: NormConfig, block: int):
        super().__init__()
        qkv_norm = norm.placement == Placement.hybrid  # HybridNorm: q, k and v per head
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qk = QKNorm.head if qkv_norm else norm.qk
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.linear_bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.linear_bias)
        self.proj.residual_proj = True
        size = cfg.d_model // cfg.n_head if self.qk == QKNorm.head else cfg.d_model
        has_qk = self.qk != QKNorm.none  # the qk position: one norm on q, one on k (and one on v)
        self.q_norm = _norm(norm, "qk", block, size) if has_qk else None
        self.k_norm = _norm(norm, "qk", block, size) if has_qk else None
        self.v_norm = _norm(norm, "qk", block, size) if qkv_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        if self.qk == QKNorm.full:  # over d_model, before the split into heads
            q, k = self.q_norm(q), self.k_norm(k)
        # (B, T, C) -> (B, H, T, C/H)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk == QKNorm.head:  # over head_dim, each head on its own
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:  # HybridNorm's QKV-norm
            v = self.v_norm(v)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """``(B, T, C) -> (B, T, 4C) -> GELU -> (B, T, C)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.linear_bias)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.linear_bias)
        self.proj.residual_proj = True
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Transformer block ``index``; ``norm.placement`` decides which norms it has and where."""

    def __init__(self, cfg: ModelConfig, norm: NormConfig, index: int):
        super().__init__()
        self.placement = norm.placement_at(index, cfg.n_layer)  # Mix-LN: post in the first blocks
        self.attn = CausalSelfAttention(cfg, norm, index)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        # Every norm position a block can have; None where its placement puts no norm.
        used, C = norm.block_positions(index, cfg.n_layer), cfg.d_model
        self.attn_in = _norm(norm, "attn_in", index, C) if "attn_in" in used else None
        self.attn_out = _norm(norm, "attn_out", index, C) if "attn_out" in used else None
        self.mlp_in = _norm(norm, "mlp_in", index, C) if "mlp_in" in used else None
        self.mlp_out = _norm(norm, "mlp_out", index, C) if "mlp_out" in used else None
        # LayerNorm Scaling (norm.depth_scale): the input norms' outputs times 1/sqrt(index + 1)
        has_in = self.attn_in is not None
        self.depth_scale = 1.0 / math.sqrt(index + 1) if norm.depth_scale and has_in else None
        # DeepNorm: the stream times alpha = (2N)^(1/4) before each residual add, N = n_layer
        deep = self.placement == Placement.deepnorm
        self.alpha = (2 * cfg.n_layer) ** 0.25 if deep else None

    def _in(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """An input norm (attn_in, mlp_in) of ``x``, scaled by ``depth_scale`` when set."""
        y = norm(x)
        return y if self.depth_scale is None else y * self.depth_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn, mlp, drop = self.attn, self.mlp, self.drop
        if self.placement == Placement.pre:
            x = x + drop(attn(self._in(self.attn_in, x)))
            x = x + mlp(self._in(self.mlp_in, x))
        elif self.placement == Placement.post:
            x = self.attn_out(x + drop(attn(x)))
            x = self.mlp_out(x + mlp(x))
        elif self.placement == Placement.deepnorm:
            x = self.attn_out(self.alpha * x + drop(attn(x)))
            x = self.mlp_out(self.alpha * x + mlp(x))
        elif self.placement == Placement.hybrid:  # q, k and v normalized inside attn
            x = self.mlp_in(x + drop(attn(x)))  # the stream itself goes through the norm
            x = x + mlp(x)
        elif self.placement == Placement.peri:
            x = x + drop(self.attn_out(attn(self._in(self.attn_in, x))))
            x = x + self.mlp_out(mlp(self._in(self.mlp_in, x)))
        else:  # reordered
            x = x + drop(self.attn_out(attn(x)))
            x = x + self.mlp_out(mlp(x))
        return x


class GPT(nn.Module):
    """Decoder-only LM of ``cfg`` (``vocab_size`` set) and a resolved ``norm`` (concrete impl).

    ``forward(idx (B, T) int64, targets (B, T) int64 | None) -> (logits (B, T, V), loss)``, loss
    the mean cross-entropy in nats/token or None; ValueError when T > ``context_length``.
    ConfigError (one line): a schedule outside ``n_layer``, a kind without the inherited impl.
    """

    def __init__(self, cfg: ModelConfig, norm: NormConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size must be set before building the model")
        norm.check(cfg.n_layer)
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model)
        # model.embedding_scale (DyT's LLM recipe): one learnable scalar, no random draw
        scale = cfg.resolved_embedding_scale
        self.emb_scale = None if scale is None else nn.Parameter(torch.full((1,), scale))
        self.drop = nn.Dropout(cfg.dropout)
        used, C = norm.used_positions(), cfg.d_model
        self.embedding = _norm(norm, "embedding", None, C) if "embedding" in used else None
        self.blocks = nn.ModuleList(Block(cfg, norm, i) for i in range(cfg.n_layer))
        self.final = _norm(norm, "final", None, C) if "final" in used else nn.Identity()
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_head:  # weight tying (Press & Wolf 2017); untied: the head draws its own
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        if norm.placement == Placement.deepnorm:
            self._scale_branches((8 * cfg.n_layer) ** -0.25)
        self._init_gates()

    def _init_weights(self, module: nn.Module) -> None:
        # Only Linear and Embedding draw random numbers, so variants whose norms differ (a bias or
        # not) consume the RNG identically and start from the same shared weights for one seed.
        if isinstance(module, nn.Linear):
            std = (
                0.02 / math.sqrt(2 * self.cfg.n_layer)
                if getattr(module, "residual_proj", False)
                else 0.02
            )
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def _scale_branches(self, beta: float) -> None:
        """DeepNorm init (Wang et al. 2022): v rows of ``qkv``, attention and MLP weights times
        ``beta`` after their normal draw, so the RNG is consumed as for post-norm."""
        C = self.cfg.d_model
        with torch.no_grad():
            for block in self.blocks:
                block.attn.qkv.weight[2 * C :].mul_(beta)  # rows [q; k; v]: v only
                for linear in (block.attn.proj, block.mlp.fc, block.mlp.proj):
                    linear.weight.mul_(beta)

    def _init_gates(self) -> None:
        """Re-draw each norm's gate (``reset_gate``) from its own generator seeded by the run seed
        and the norm's index; the global RNG is untouched, so shared parameters stay paired."""
        gated = [m for m in self.modules() if hasattr(m, "reset_gate")]
        for index, norm in enumerate(gated):
            seed = (torch.initial_seed() * 1_000_003 + GATE_SEED_OFFSET + index) % 2**63
            norm.reset_gate(torch.Generator().manual_seed(seed))

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (a tied head once), position embeddings excluded by default."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_emb.weight.numel() if non_embedding else n

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 N + 12 L C T (Kaplan et al. 2020; PaLM appendix B)."""
        c = self.cfg
        return 6.0 * self.num_params() + 12.0 * c.n_layer * c.d_model * c.context_length

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        if T > self.cfg.context_length:
            raise ValueError(
                f"sequence length {T} exceeds model.context_length={self.cfg.context_length}"
            )
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        x = x if self.emb_scale is None else x * self.emb_scale  # model.embedding_scale
        x = self.drop(x if self.embedding is None else self.embedding(x))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
