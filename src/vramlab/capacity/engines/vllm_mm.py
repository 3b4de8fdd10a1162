"""vLLM V1's start-up profile of a vision encoder, for the Qwen2-VL family (read in each release's wheel).

Before its dummy forward, V1's `profile_run` runs the vision tower on a batch of dummy items "of the maximum
feature size" and keeps their embeddings in the encoder cache through the dummy forward and the sampler; the
torch peak it takes off the budget is the larger of the two phases. The log says what it profiled:
"Encoder cache will be initialized with a budget of N tokens, and profiled with K video items of the
maximum feature size."

- Tokens per item (`get_mm_max_tokens_per_item`, seq_len = max_model_len): an image at the image processor's
  `max_pixels` (12,845,056 in Qwen2-VL's and Qwen2.5-VL's preprocessor: 65,536 patches of 14 px, merged 2x2
  into 16,384 tokens); a video at that size with the most frames whose tokens fit max_model_len, frames
  padded to the temporal patch (2), at most `_MAX_FRAMES_PER_VIDEO` (16 up to 0.10, 14 from 0.11). The
  frames are shared between the videos a prompt may hold: up to 0.11 the count is the prompt limit (999 by
  default in V1, so one frame), from 0.13 one per modality (`{modality: 1}`), so a 128k context profiles a
  14-frame video of 114,688 tokens. Up to 0.9 the images a prompt may hold come off the video's length first.
- Budget (`compute_(mm_)encoder_budget`): max(max_num_batched_tokens, the largest item). Items: up to 0.9
  ceil(budget / item) capped by max_num_seqs x the prompt limit; from 0.10 floor(budget / item) capped by
  max_num_seqs x max(1, min(limit, max_model_len // item)), at least one.
- Encoder phase: the dummy pixels (patches x channels x temporal patch x patch^2, in the model dtype) stay
  on the card for the whole profile, beside the peak inside one ViT block. At the MLP's down projection
  vLLM 0.23's `Qwen2_5_VisionBlock` holds the block input, the attention output, the normed input, the
  residual, gate_up (2 x intermediate), the activation (1 x) and the output: 5 hidden + 3 intermediate
  wide per patch. Qwen2-VL's block (`x = x + attn(norm1(x)); x = x + mlp(norm2(x))`, fc1 / QuickGELU / fc2)
  holds 3 hidden + 2 intermediate at its activation. Under tensor parallelism the MLP is split.
- Decoder phase: the dummy forward's own peak plus the pixels and the cached embeddings (budget-sized
  items x the language model's width).
Which elementwise kernels run (vLLM's custom ops or torch's native ones) and older releases' block code
move the block peak by about one hidden or intermediate copy: that is the band, not a fitted constant.
V0's multimodal profile (one image and one video per prompt inside the dummy sequences) is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramlab.capacity.spec import ModelSpec, VisionTower, dtype_bytes

PROMPT_LIMIT_DEFAULT_V1 = 999  # MultiModalConfig.get_limit_per_prompt: 999 per modality in V1 (1 in V0)
FRAMES_CAP_14_FROM = (0, 11)  # _MAX_FRAMES_PER_VIDEO 16 -> 14 (read in 0.10.2 and 0.11.0)
ONE_PER_MODALITY_FROM = (
    0,
    13,
)  # max tokens per item counted with {modality: 1}, not the prompt limits (0.13.0)
FLOOR_ITEMS_FROM = (0, 10)  # MultiModalBudget.get_max_items (floor, max_model_len cap) replaces cdiv (0.10.2)
IMAGES_OFF_VIDEO_BEFORE = (0, 10)  # up to 0.9 the images a prompt holds come off the video's frames
BLOCK_BAND = 0.15  # one hidden or intermediate copy either way (kernel path, release's block code)


@dataclass(frozen=True)
class EncoderProfile:
    """What V1's multimodal profile runs, as its log line says it, and the memory it holds."""

    modality: str
    items: int
    tokens_per_item: int
    budget_tokens: int
    patches: int  # all items together, one encoder forward
    encoder_peak_bytes: float  # pixels + the ViT block's peak
    held_bytes: float  # pixels + cached embeddings, alive through the dummy forward and the sampler

    def to_json(self) -> dict[str, object]:
        return {
            "modality": self.modality,
            "items": self.items,
            "tokens_per_item": self.tokens_per_item,
            "budget_tokens": self.budget_tokens,
            "patches": self.patches,
            "encoder_peak_bytes": int(self.encoder_peak_bytes),
            "held_bytes": int(self.held_bytes),
        }

    def describe(self) -> str:
        return (
            f"vision encoder on {self.items} {self.modality} item(s) of {self.tokens_per_item:,} tokens "
            f"({self.patches:,} patches; encoder budget {self.budget_tokens:,} tokens)"
        )


def limits_of(settings_limits: tuple[tuple[str, int], ...] | None) -> dict[str, int]:
    """`--limit-mm-per-prompt` as vLLM V1 reads it: a modality left out keeps its default (999)."""
    out = {"image": PROMPT_LIMIT_DEFAULT_V1, "video": PROMPT_LIMIT_DEFAULT_V1}
    for modality, count in settings_limits or ():
        out[modality] = count
    return out


def _slice_tokens(tower: VisionTower) -> int:
    """Merged tokens of one image, or one temporal slice of a video, at max_pixels."""
    return tower.max_pixels // (tower.patch_size**2) // (tower.spatial_merge_size**2)


def _video_tokens(tower: VisionTower, frames: int) -> int:
    """Frames padded up to the temporal patch, one slice per patch (at least one)."""
    return max(1, -(-frames // tower.temporal_patch_size)) * _slice_tokens(tower)


def _video_frames(tower: VisionTower, room: int, videos: int, version: tuple[int, ...]) -> int:
    """`get_num_frames_with_most_features`: the most frames whose tokens fit `room` (whole temporal patches:
    `_get_max_video_frames`' loop stops where one more frame would open a slice that does not fit), shared
    by `videos`, capped, at least one."""
    frames = max(0, room) // _slice_tokens(tower) * tower.temporal_patch_size
    cap = 14 if version >= FRAMES_CAP_14_FROM else 16
    return max(1, min(frames // max(videos, 1), cap))


def tokens_per_item(
    tower: VisionTower, max_model_len: int, limits: dict[str, int], version: tuple[int, ...]
) -> dict[str, int]:
    """Each enabled modality's largest item, as the release counts it."""
    image = _slice_tokens(tower)
    counts = {m: 1 for m, n in limits.items() if n > 0} if version >= ONE_PER_MODALITY_FROM else dict(limits)
    room = max_model_len
    if version < IMAGES_OFF_VIDEO_BEFORE:
        room -= image * counts.get("image", 0)
    frames = _video_frames(tower, room, counts.get("video", 0), version)
    out = {"image": image, "video": _video_tokens(tower, frames)}
    return {m: n for m, n in out.items() if limits.get(m, 0) > 0}


def encoder_profile(
    model: ModelSpec,
    *,
    max_model_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    chunked_prefill: bool,
    limits: dict[str, int],
    version: tuple[int, ...],
    model_dtype: str,
    tp: int,
) -> EncoderProfile | None:
    """The batch V1 profiles the tower with and the memory it holds; None when nothing is profiled."""
    tower = model.vision
    if tower is None:
        return None
    per_item = tokens_per_item(tower, max_model_len, limits, version)
    if not per_item:
        return None  # every modality limited to 0: no encoder cache, nothing profiled
    modality, item = max(per_item.items(), key=lambda kv: (kv[1], kv[0]))
    budget = max(max_num_batched_tokens, item)
    limit = limits[modality]
    if version >= FLOOR_ITEMS_FROM:
        per_prompt = max(1, min(limit, max_model_len // item))
        reqs = max_num_seqs if chunked_prefill else min(max_num_seqs, max_num_batched_tokens // item)
        items = max(1, min(budget // item, reqs * per_prompt))
    else:
        items = min(-(-budget // item), max_num_seqs * limit)
    patches_per_item = item * tower.spatial_merge_size**2
    patches = items * patches_per_item
    b = dtype_bytes(model_dtype)
    pixels = patches * tower.in_channels * tower.temporal_patch_size * tower.patch_size**2 * b
    h = patches * tower.hidden_size * b
    m = patches * tower.intermediate_size / tp * b
    block = max(5 * h + 3 * m, 10 * h) if tower.gated else max(3 * h + 2 * m, 10 * h)
    embeddings = items * item * tower.out_hidden_size * b
    return EncoderProfile(modality, items, item, budget, patches, pixels + block, pixels + embeddings)
