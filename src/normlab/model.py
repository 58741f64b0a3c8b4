"""A GPT you can read top to bottom (after nanoGPT), with every norm built by ``norms.build_norm``.

Shapes: B batch, T sequence length (<= context_length), C = d_model, H heads, V vocabulary.
Token + learned position embeddings, causal self-attention through
``F.scaled_dot_product_attention``, a GELU MLP (4C hidden), a final norm, and an output head tied
to the token embedding. Init follows GPT-2 (Radford et al. 2019): N(0, 0.02) for linear and
embedding weights, residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases, norm gains 1.

Placement (``norm.placement``), written out in ``Block.forward``:

* ``pre`` (GPT-2):  x = x + attn(norm1(x));  x = x + mlp(norm2(x));  logits = head(norm_f(x))
* ``post`` (Vaswani et al. 2017): x = norm1(x + attn(x));  x = norm2(x + mlp(x));
  the final norm is kept too, so both placements have the same parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from normlab.config import ModelConfig, NormConfig, Placement
from normlab.norms import build_norm


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``(B, T, C) -> (B, T, C)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.linear_bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.linear_bias)
        self.proj.residual_proj = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, H, T, C/H)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
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
    """One transformer block; ``norm.placement`` decides where its two norms sit."""

    def __init__(self, cfg: ModelConfig, norm: NormConfig):
        super().__init__()
        self.pre_norm = norm.placement == Placement.pre
        self.norm1 = build_norm(norm, cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = build_norm(norm, cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.norm1(x)))
            x = x + self.mlp(self.norm2(x))
        else:
            x = self.norm1(x + self.drop(self.attn(x)))
            x = self.norm2(x + self.mlp(x))
        return x


class GPT(nn.Module):
    """Decoder-only transformer language model.

    Args:
        cfg: shape; ``cfg.vocab_size`` must be set (the trainer fills it from the tokenizer).
        norm: a *resolved* norm config (concrete ``impl``), see ``norms.resolve_norm``.

    ``forward(idx (B, T) int64, targets (B, T) int64 | None)`` returns
    ``(logits (B, T, V), loss)`` where loss is the mean cross-entropy in nats/token (None without
    targets). Raises ValueError when T exceeds ``context_length``.
    """

    def __init__(self, cfg: ModelConfig, norm: NormConfig):
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("model.vocab_size must be set before building the model")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context_length, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, norm) for _ in range(cfg.n_layer))
        self.norm_f = build_norm(norm, cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying (Press & Wolf 2017)
        self.apply(self._init_weights)

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

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count: the tied head once, position embeddings excluded by default."""
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
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
