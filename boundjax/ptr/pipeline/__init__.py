"""The post-hoc PTR pipeline (Singh et al., NeurIPS 2023, "Posthoc privacy guarantees for
collaborative inference with modified Propose-Test-Release", here "PTR"; App. D).

Offline, on public/training data: a β-VAE embedder ``E`` (`vae`), an obfuscator ``f`` (a small
ReLU MLP), predictor ``g`` and adversary ``D`` trained jointly by adversarial representation
learning (`arl`), and a proposal ``Δp`` (`boundjax.ptr.release.propose_bound`). Online, per
query image: ``z = E(x)`` and the PTR release of ``f(z)`` (`boundjax.ptr.release`), scored by
`evaluate`. `baselines` holds Table 1's LDP-Image, LDP-Embedding and Adversarial rows; `attack`
the reconstruction attack of Tables 2–5 with SSIM, ℓ1, MSE and PSNR.
"""

from boundjax.ptr.pipeline.arl import (ARLConfig, Decoder, Predictor, TrainedARL,
                                       contrastive_loss, obfuscator_apply, train_arl)
from boundjax.ptr.pipeline.attack import AttackResult, attack_grid, metrics
from boundjax.ptr.pipeline.baselines import (OutputRange, SmallCNN, adversarial_release,
                                             embedding_scale, image_scale, ldp_embedding_release,
                                             ldp_image, ldp_image_grid, noisy_images)
from boundjax.ptr.pipeline.evaluate import (PTRAccuracy, ptr_accuracy, ptr_accuracy_grid,
                                            release_from_statistics)
from boundjax.ptr.pipeline.vae import BetaVAE, TrainedVAE, VAEConfig, elbo_loss, train_vae

__all__ = [
    "ARLConfig", "Decoder", "Predictor", "TrainedARL", "contrastive_loss", "obfuscator_apply",
    "train_arl", "AttackResult", "attack_grid", "metrics", "OutputRange", "SmallCNN",
    "adversarial_release", "embedding_scale", "image_scale", "ldp_embedding_release",
    "ldp_image", "ldp_image_grid", "noisy_images", "PTRAccuracy", "ptr_accuracy",
    "ptr_accuracy_grid", "release_from_statistics", "BetaVAE", "TrainedVAE",
    "VAEConfig", "elbo_loss", "train_vae",
]
