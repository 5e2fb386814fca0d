"""Writes the PyTorch exports that ``tests/test_io_onnx.py`` loads (run by hand, not by the tests).

PyTorch is not a dependency of boundjax; run this in a throwaway environment::

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0 onnx onnxscript numpy
    /tmp/torchenv/bin/python tests/data/make_torch_exports.py

Each network is exported twice with torch 2.13: by the default exporter (``torch.export`` based,
``dynamo=True``, which needs ``onnxscript``) and by the TorchScript-based one (``dynamo=False``).
The widths are tiny so every file stays well under 200 KB. Weights come from a fixed seed, and
batch-norm statistics are set to non-trivial values so the files exercise them.
"""

from __future__ import annotations

import pathlib

import torch
from torch import nn

HERE = pathlib.Path(__file__).resolve().parent


class SmallCnn(nn.Module):
  """MNIST-sized CNN: conv-ReLU-maxpool-BN, conv-BN-ReLU-avgpool, flatten, linear-ReLU-linear.

  Both exporters fold a BatchNorm that follows a convolution into its weights; the first one
  follows a pooling layer, so it stays a ``BatchNormalization`` node."""

  def __init__(self):
    super().__init__()
    self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
    self.bn1 = nn.BatchNorm2d(4)
    self.conv2 = nn.Conv2d(4, 4, 3, stride=2)
    self.bn2 = nn.BatchNorm2d(4)
    self.fc1 = nn.Linear(4 * 3 * 3, 16)
    self.fc2 = nn.Linear(16, 10)

  def forward(self, x):
    x = self.bn1(nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2))      # 4 x 14 x 14
    x = nn.functional.avg_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)      # 4 x 3 x 3
    x = torch.flatten(x, 1)
    return self.fc2(torch.relu(self.fc1(x)))


class TinyBlock(nn.Module):
  """A transformer-style block on (batch, tokens, width): a class token expanded to the batch and
  concatenated in front, a constant token mask (``where``), token mixing (a linear map over the
  token axis, as in MLP-Mixer, so the class token sees the input), a pre-LayerNorm MLP with exact (erf)
  GELU and a residual add, a second one with tanh-approximated GELU, HardSwish gated by a
  HardSigmoid, and a linear head on the class token."""

  def __init__(self, width=8, hidden=16, classes=3, tokens=4):
    super().__init__()
    self.cls = nn.Parameter(0.5 * torch.randn(1, 1, width))
    self.register_buffer("keep", torch.arange(tokens + 1) != 2)
    self.gate = nn.Linear(width, width)
    self.mix = nn.Linear(tokens + 1, tokens + 1)
    self.ln1 = nn.LayerNorm(width)
    self.up1 = nn.Linear(width, hidden)
    self.down1 = nn.Linear(hidden, width)
    self.ln2 = nn.LayerNorm(width)
    self.up2 = nn.Linear(width, hidden)
    self.down2 = nn.Linear(hidden, width)
    self.head = nn.Linear(width, classes)

  def forward(self, x):
    x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
    x = torch.where(self.keep[:, None], x, 0.0)
    x = x + self.mix(x.transpose(1, 2)).transpose(1, 2)
    x = x + self.down1(nn.functional.gelu(self.up1(self.ln1(x))))
    x = x + self.down2(nn.functional.gelu(self.up2(self.ln2(x)), approximate="tanh"))
    x = nn.functional.hardswish(x) * nn.functional.hardsigmoid(self.gate(x))
    return self.head(x[:, 0])


def _randomise_batch_norm(module: nn.Module, gen: torch.Generator) -> None:
  for m in module.modules():
    if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
      with torch.no_grad():
        m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=gen))
        m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))
        if isinstance(m, nn.BatchNorm2d):
          m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
          m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))


def main() -> None:
  gen = torch.Generator().manual_seed(0)
  torch.manual_seed(0)
  nets = {"torch_cnn": (SmallCnn(), torch.zeros(1, 1, 28, 28)),
          "torch_block": (TinyBlock(), torch.zeros(1, 4, 8))}
  for stem, (net, x) in nets.items():
    _randomise_batch_norm(net, gen)
    net.eval()
    for suffix, dynamo in (("dynamo", True), ("script", False)):
      path = HERE / f"{stem}_{suffix}.onnx"
      torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"],
                        dynamo=dynamo, external_data=False,
                        **({} if dynamo else {"opset_version": 17}))
      print(path.name, path.stat().st_size, "bytes")


if __name__ == "__main__":
  main()
