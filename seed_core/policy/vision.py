"""Images in prompts: the mark, the checks, and one adapter per vision-language architecture.

A prompt that shows an image holds IMAGE_MARK where the image goes. `ChatEncoder.encode_full(prompt, image)`
replaces the mark with the architecture's block of image tokens (`VisionInputs.image_tokens`), and every forward
pass over that prompt (sampling, re-scoring, the update, SFT) gets the pixels from `VisionInputs.pixels`. Both come
from here, so a sampled prompt and its re-scored twin are the same tokens and the same pixels.

Two architectures:
- SmolVLM, the CPU composite that `models.build_composite` makes: one image token per 16-px patch (no pixel
  shuffle), so a 96x96 Sokoban image is 36 tokens, one per tile. Pixels are scaled to [-1, 1] as SmolVLM's
  processor does; the image is not resized, so its size must be the encoder's.
- Qwen2.5-VL, the paper's model: transformers' own image processor (the PIL one: torchvision is not installed
  here) resizes to multiples of 28 px and makes 14-px patches merged 2x2 into one token.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

IMAGE_MARK = "<image>"
"""Where a prompt's image goes (SmolVLM's image token; in prompt text it is only a mark)."""


class VisionError(ValueError):
    """An image, a prompt or a model that do not fit together; the message names what to change."""


def check_image(image, size: tuple[int, int] | None = None) -> np.ndarray:
    """`image` as an (H, W, 3) uint8 array; a missing, non-RGB or (with `size`) wrongly sized image is a VisionError."""
    if image is None:
        raise VisionError("an image observation is missing (None); every prompt holding <image> needs its image")
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise VisionError(f"an image observation must be RGB, shape (H, W, 3) uint8; got shape {arr.shape} {arr.dtype}")
    if size is not None and arr.shape[:2] != size:
        raise VisionError(
            f"the image is {arr.shape[0]}x{arr.shape[1]} px but the model's vision encoder takes {size[0]}x{size[1]}: "
            "set vision.image_size to 16 x the room side and re-run prepare (or change env.sokoban.dim)"
        )
    return arr


class VisionInputs(Protocol):
    def image_tokens(self, image) -> list[int]:
        """The token ids that stand for `image` in a prompt."""
        ...

    def pixels(self, images: list) -> dict:
        """The model's pixel inputs for a batch of sequences, one image each or None for a text-only row (an SFT
        batch may mix them); float tensors in fp32."""
        ...


class SmolVLMInputs:
    def __init__(self, config):
        vc = config.vision_config
        self.size = (vc.image_size, vc.image_size)
        self.count = (vc.image_size // vc.patch_size) ** 2 // config.scale_factor**2
        self.token = config.image_token_id

    def image_tokens(self, image) -> list[int]:
        check_image(image, self.size)
        return [self.token] * self.count

    def pixels(self, images: list) -> dict:
        import torch

        blank = np.zeros((*self.size, 3), dtype=np.uint8)
        x = torch.from_numpy(np.stack([blank if im is None else check_image(im, self.size) for im in images]))
        x = x.permute(0, 3, 1, 2).float().div(255).sub(0.5).div(0.5)  # SmolVLM's image_mean = image_std = 0.5
        x[[im is None for im in images]] = 0.0  # an all-zero image is padding to SmolVLM: no image in that row
        mask = torch.ones(x.shape[0], 1, *self.size, dtype=torch.bool)
        return {"pixel_values": x[:, None], "pixel_attention_mask": mask}  # (B, 1 image, 3, H, W)


class QwenVLInputs:
    def __init__(self, config):
        from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

        vc = config.vision_config
        self.merge = vc.spatial_merge_size
        self.processor = Qwen2VLImageProcessorPil(
            patch_size=vc.patch_size, temporal_patch_size=vc.temporal_patch_size, merge_size=self.merge
        )
        self.start, self.pad, self.end = config.vision_start_token_id, config.image_token_id, config.vision_end_token_id

    def _processed(self, images: list) -> dict:
        return dict(self.processor(images=[check_image(im) for im in images], return_tensors="pt"))

    def image_tokens(self, image) -> list[int]:
        grid = self._processed([image])["image_grid_thw"][0]
        return [self.start] + [self.pad] * (int(grid.prod()) // self.merge**2) + [self.end]

    def pixels(self, images: list) -> dict:
        out = self._processed([im for im in images if im is not None])  # rows without an image have no tokens
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


ADAPTERS = {"smolvlm": SmolVLMInputs, "qwen2_5_vl": QwenVLInputs, "qwen2_vl": QwenVLInputs}


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def check_observation(observation: str, is_vision: bool, model: object) -> None:
    """Refuse, before any work, image observations for a text-only `model` (a path or a name)."""
    if observation != "text" and not is_vision:
        raise VisionError(
            f"params: `env.observation` is {observation!r}, but {model} is a text-only model; set vision.composite: "
            "true and re-run prepare (the CPU composite), or model.name_or_path to a vision-language model, or "
            "env.observation: text"
        )


def vision_inputs(config) -> VisionInputs | None:
    """The image adapter of a model config; None for a text-only model."""
    if not is_vision_config(config):
        return None
    if config.model_type not in ADAPTERS:
        raise VisionError(
            f"model type {config.model_type!r} is a vision-language model this project has no image adapter for; "
            f"supported: {sorted(ADAPTERS)}"
        )
    return ADAPTERS[config.model_type](config)
