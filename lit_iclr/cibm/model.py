"""Concept bottleneck models with an optional stochastic concept layer, in one code path (plain torch).

Every family maps an input x (an embedding, or an image through a timm backbone) to features h, then to a Gaussian
latent p(z|x) = N(mu(h), sigma(h)^2) with sigma = softplus(.) clamped at 1e-7 (deterministic models: z = mu), then to
concept logits and a label prediction q(y|.):

    joint        z = concept logits; y = Linear(z)                                  (Koh et al.; the paper's StochasticMLP)
    sequential   z = concept logits; y = Linear(sigmoid(z)), trained after the concepts on frozen predictions
    independent  z = concept logits; y = Linear(c) trained on true concepts, applied to sigmoid(z) at test
    cem          per concept a positive and a negative embedding c_i^+/-; z_i = score s([c_i^+, c_i^-]);
                 c_i = p_i c_i^+ + (1 - p_i) c_i^-, p_i = sigmoid(z_i); y = Linear(concat c_i)   (Espinosa Zarlenga et al.)
    probcbm      z = per-concept Gaussian embeddings e_i (D dims); logit_i = a (|e_i - v_i^-| - |e_i - v_i^+|) with learned
                 anchors v_i^+/-; y = Linear(sigmoid(logits))                     (Kim et al.; ProbCBM-style, one sample)
    blackbox     no concept supervision; y = Linear(ReLU(z))                      (the official BasicMLP reference)

mu and sigma are two MLP heads (the official `pred_mu` / `pred_sigma`); `head_params()` lists them (the parameters IB_E's
entropy term may reach). Interventions replace chosen concepts by their true values: logits are set to
+/-(max z - mean z) (stochastic joint, official `forward_tti`) or +/-3 (deterministic joint, official `BasicMLP`);
probability-fed families get the true 0/1 value.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lit_iclr.core.backbones import create_backbone

FAMILIES = ("joint", "sequential", "independent", "cem", "probcbm", "blackbox")
EPS = 1e-7


def mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


class ConceptBottleneck(nn.Module):
    def __init__(self, input_shape: list[int], num_concepts: int, num_classes: int, family: str = "joint",
                 stochastic: bool = True, hidden: int = 256, emb_dim: int = 16, backbone: str = "test_resnet"):
        """
        Args:
            input_shape: [D] for embeddings, [C, H, W] for images (a timm `backbone` is then trained end to end).
            num_concepts: K.
            num_classes: Label classes.
            family: One of FAMILIES.
            stochastic: Gaussian concept layer (False: z = mu). probcbm is always stochastic.
            hidden: Width of the mu / sigma MLP heads.
            emb_dim: Per-concept embedding size (cem, probcbm).
            backbone: timm architecture for image inputs.
        """
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
        self.family, self.k, self.m = family, num_concepts, emb_dim
        self.stochastic = stochastic or family == "probcbm"
        if len(input_shape) == 3:
            self.backbone = create_backbone(backbone, in_chans=input_shape[0])
            d = self.backbone.num_features
        elif len(input_shape) == 1:
            self.backbone, d = None, input_shape[0]
        else:
            raise ValueError(f"input_shape must be [D] or [C, H, W], got {input_shape}")
        k, m = num_concepts, emb_dim
        if family == "cem":
            # mu head: h -> concept embeddings (K, 2, m) -> shared score; the score logit is the Gaussian mean
            self.embed = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, k * 2 * m), nn.LeakyReLU())
            self.score = nn.Linear(2 * m, 1)
            self.pred_sigma = mlp(d, hidden, k) if self.stochastic else None
            self.head = nn.Linear(k * m, num_classes)
        elif family == "probcbm":
            self.pred_mu = mlp(d, hidden, k * m)
            self.pred_sigma = mlp(d, hidden, k * m)
            self.anchors = nn.Parameter(torch.randn(2, k, m) * 0.5)  # v^- (row 0), v^+ (row 1)
            self.log_scale = nn.Parameter(torch.tensor(1.0))
            self.head = nn.Linear(k, num_classes)
        else:
            self.pred_mu = mlp(d, hidden, k)
            self.pred_sigma = mlp(d, hidden, k) if self.stochastic else None
            self.head = nn.Linear(k, num_classes)

    def head_params(self) -> list[nn.Parameter]:
        """The concept encoder heads (mu and sigma MLPs), without backbone and label head: IB_E's gradient target."""
        mods = [self.embed, self.score] if self.family == "cem" else [self.pred_mu]
        if self.pred_sigma is not None:
            mods.append(self.pred_sigma)
        return [p for mod in mods for p in mod.parameters()]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x) if self.backbone is not None else x

    def latent(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        """Gaussian parameters of p(z|x) from features h: `mu`, `sigma` (None when deterministic), and CEM's embeddings."""
        out: dict[str, torch.Tensor] = {}
        if self.family == "cem":
            emb = self.embed(h).view(-1, self.k, 2, self.m)
            out["emb"] = emb
            out["mu"] = self.score(emb.flatten(2)).squeeze(-1)
        else:
            out["mu"] = self.pred_mu(h)
        if self.pred_sigma is not None:
            out["sigma"] = F.softplus(self.pred_sigma(h)).clamp(min=EPS)
        return out

    def encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.latent(self.features(x))

    def sample(self, enc: dict[str, torch.Tensor], sample: bool = True, eps: torch.Tensor | None = None) -> torch.Tensor:
        """z = mu + sigma * eps, eps ~ N(0, I) (reparameterised; `eps` given or drawn), or mu for deterministic models /
        `sample=False`."""
        if "sigma" not in enc or not sample:
            return enc["mu"]
        return enc["mu"] + enc["sigma"] * (torch.randn_like(enc["mu"]) if eps is None else eps)

    def concept_logits(self, z: torch.Tensor) -> torch.Tensor:
        if self.family != "probcbm":
            return z
        e = z.view(-1, self.k, self.m)
        d_neg = (e - self.anchors[0]).norm(dim=-1)
        d_pos = (e - self.anchors[1]).norm(dim=-1)
        return self.log_scale.exp() * (d_neg - d_pos)

    def decide(self, enc: dict[str, torch.Tensor], z: torch.Tensor, c_true: torch.Tensor | None = None,
               mask: torch.Tensor | None = None, head_on_true: bool = False, detach_concepts: bool = False) -> dict:
        """Concept logits and label logits from a latent sample z; `mask` (B, K) intervenes with `c_true` there."""
        c_logits = self.concept_logits(z)
        out = {"z": z, "c_logits": c_logits}
        if self.family == "joint" or self.family == "blackbox":
            zz = z
            if mask is not None:
                scale = (z.max() - z.mean()).detach() if self.stochastic else torch.tensor(3.0)
                zz = torch.where(mask, (2 * c_true - 1) * scale, z)
            out["y_logits"] = self.head(F.relu(zz) if self.family == "blackbox" else zz)
            return out
        p = torch.sigmoid(c_logits)
        if detach_concepts:
            p = p.detach()
        if mask is not None:
            p = torch.where(mask, c_true, p)
        if head_on_true:
            p = c_true
        if self.family == "cem":
            emb = enc["emb"]
            mix = p.unsqueeze(-1) * emb[:, :, 0] + (1 - p.unsqueeze(-1)) * emb[:, :, 1]
            out["y_logits"] = self.head(mix.flatten(1))
        else:
            out["y_logits"] = self.head(p)
        return out

    def forward(self, x: torch.Tensor, sample: bool = True) -> dict:
        enc = self.encode(x)
        return {**enc, **self.decide(enc, self.sample(enc, sample))}
