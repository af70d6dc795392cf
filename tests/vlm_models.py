"""Tiny vision-language models of each family hookviz vlm knows, built offline from configs the size of
transformers' own test configs, each with a real processor (a word-level tokenizer and the family's own
image processor), savable as a folder ``--model hf:DIR`` loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: The words the tiny tokenizers know (the shapes' names, a question, the families' image tokens).
WORDS = [
    "<pad>",
    "<unk>",
    "<s>",
    "</s>",
    "<image>",
    "<|vision_start|>",
    "<|image_pad|>",
    "<|vision_end|>",
    "<|video_pad|>",
    "USER:",
    "ASSISTANT:",
    "what",
    "shape",
    "is",
    "this",
    "?",
    "a",
    "an",
    "it",
    "square",
    "disc",
    "cross",
    "the",
    "caption",
    "en",
    "<fake_token_around_image>",
    "<global-img>",
    "<end_of_utterance>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<video>",
]
PAD, UNK, BOS, EOS = 0, 1, 2, 3
FAMILIES = ("llava", "llava-next", "paligemma", "qwen2-vl", "qwen2.5-vl", "idefics3", "internvl")


def tokenizer(extra: dict[str, str] | None = None) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens=extra or {},
    )
    fast.add_special_tokens({"additional_special_tokens": [w for w in WORDS if w.startswith("<")][4:]})
    return fast


def _text(**kw: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(WORDS),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "pad_token_id": PAD,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        **kw,
    }


def build(
    family: str, size: int = 64, seed: int = 0, vision: dict[str, int] | None = None, **text: Any
) -> tuple[torch.nn.Module, Any]:
    """A tiny ``family`` model (random weights, seeded) and its processor, for photos of ``size`` pixels;
    ``vision``: sizes of the tower other than the defaults, ``text``: of the decoder."""
    import transformers as T

    torch.manual_seed(seed)
    mean, std = [0.5] * 3, [0.25] * 3
    if family == "llava":
        image = T.CLIPImageProcessor(
            size={"shortest_edge": size},
            crop_size={"height": size, "width": size},
            image_mean=mean,
            image_std=std,
        )
        processor = T.LlavaProcessor(
            image_processor=image,
            tokenizer=tokenizer({"image_token": "<image>"}),
            patch_size=8,
            vision_feature_select_strategy="default",
            image_token="<image>",
            num_additional_image_tokens=1,
        )
        config = T.LlavaConfig(
            vision_config={
                "model_type": "clip_vision_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": size,
                "patch_size": 8,
                **(vision or {}),
            },
            text_config={"model_type": "llama", **_text(**text)},
            image_token_index=4,
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
        )
        return T.LlavaForConditionalGeneration(config).eval(), processor
    if family == "paligemma":
        image = T.SiglipImageProcessor(size={"height": size, "width": size}, image_mean=mean, image_std=std)
        tok = tokenizer({"image_token": "<image>"})
        image.image_seq_length = (size // 8) ** 2
        processor = T.PaliGemmaProcessor(image_processor=image, tokenizer=tok)
        config = T.PaliGemmaConfig(
            vision_config={
                "model_type": "siglip_vision_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": size,
                "patch_size": 8,
                "projection_dim": 32,
            },
            text_config={"model_type": "gemma", **_text(head_dim=8, **text)},
            image_token_index=4,
            projection_dim=32,
            hidden_size=32,
        )
        return T.PaliGemmaForConditionalGeneration(config).eval(), processor
    if family in ("qwen2-vl", "qwen2.5-vl"):
        image = T.Qwen2VLImageProcessor(
            min_pixels=32 * 32,
            max_pixels=4 * size * size,
            patch_size=8,
            merge_size=2,
            temporal_patch_size=2,
            image_mean=mean,
            image_std=std,
        )
        tok = tokenizer(
            {
                "image_token": "<|image_pad|>",
                "video_token": "<|video_pad|>",
                "vision_start_token": "<|vision_start|>",
                "vision_end_token": "<|vision_end|>",
            }
        )
        if family == "qwen2.5-vl":  # windowed attention in the tower, every other block global
            processor = T.Qwen2_5_VLProcessor(
                image_processor=image, tokenizer=tok, video_processor=T.Qwen2VLVideoProcessor(patch_size=8)
            )
            config = T.Qwen2_5_VLConfig(
                text_config=_text(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, **text),
                vision_config={
                    "depth": 2,
                    "hidden_size": 32,
                    "out_hidden_size": 32,
                    "intermediate_size": 64,
                    "num_heads": 4,
                    "patch_size": 8,
                    "spatial_merge_size": 2,
                    "temporal_patch_size": 2,
                    "in_channels": 3,
                    "window_size": 32,
                    "fullatt_block_indexes": [1],
                },
                image_token_id=6,
                video_token_id=8,
                vision_start_token_id=5,
                vision_end_token_id=7,
            )
            return T.Qwen2_5_VLForConditionalGeneration(config).eval(), processor
        processor = T.Qwen2VLProcessor(
            image_processor=image, tokenizer=tok, video_processor=T.Qwen2VLVideoProcessor(patch_size=8)
        )
        config = T.Qwen2VLConfig(
            text_config=_text(rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, **text),
            vision_config={
                "depth": 2,
                "embed_dim": 32,
                "hidden_size": 32,
                "num_heads": 4,
                "mlp_ratio": 2,
                "patch_size": 8,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "in_chans": 3,
            },
            image_token_id=6,
            video_token_id=8,
            vision_start_token_id=5,
            vision_end_token_id=7,
        )
        return T.Qwen2VLForConditionalGeneration(config).eval(), processor
    if family == "llava-next":  # a base view and tiles of 32 px on the best of three grids
        pinpoints = [[32, 64], [64, 32], [64, 64]]
        image = T.LlavaNextImageProcessor(
            size={"shortest_edge": 32},
            crop_size={"height": 32, "width": 32},
            image_grid_pinpoints=pinpoints,
            image_mean=mean,
            image_std=std,
        )
        processor = T.LlavaNextProcessor(
            image_processor=image,
            tokenizer=tokenizer({"image_token": "<image>"}),
            patch_size=8,
            vision_feature_select_strategy="default",
            image_token="<image>",
            num_additional_image_tokens=1,
        )
        config = T.LlavaNextConfig(
            vision_config={
                "model_type": "clip_vision_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": 32,
                "patch_size": 8,
                **(vision or {}),
            },
            text_config={"model_type": "llama", **_text(**text)},
            image_token_index=4,
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
            image_grid_pinpoints=pinpoints,
        )
        return T.LlavaNextForConditionalGeneration(config).eval(), processor
    if family == "idefics3":  # SmolVLM's architecture: tiles of 64 px and a global view, 4 x 4 tokens each
        image = T.Idefics3ImageProcessor(
            size={"longest_edge": 2 * size},
            max_image_size={"longest_edge": size},
            do_image_splitting=True,
            image_mean=mean,
            image_std=std,
        )
        tok = tokenizer({"image_token": "<image>"})
        processor = T.Idefics3Processor(image_processor=image, tokenizer=tok, image_seq_len=(size // 16) ** 2)
        config = T.Idefics3Config(
            vision_config={
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": size,
                "patch_size": 8,
                **(vision or {}),
            },
            text_config={"model_type": "llama", **_text(**text)},
            scale_factor=2,
            image_token_id=4,
        )
        return T.Idefics3ForConditionalGeneration(config).eval(), processor
    if (
        family == "internvl"
    ):  # tiles of 32 px on the closest grid of at most 4 and a thumbnail, 2 x 2 tokens each
        tok = tokenizer(
            {
                "start_image_token": "<img>",
                "end_image_token": "</img>",
                "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>",
            }
        )
        image = T.GotOcr2ImageProcessor(
            size={"height": 32, "width": 32},
            crop_to_patches=True,
            min_patches=1,
            max_patches=4,
            image_mean=mean,
            image_std=std,
        )
        processor = T.InternVLProcessor(
            image_processor=image,
            tokenizer=tok,
            image_seq_length=4,
            video_processor=T.InternVLVideoProcessor(),
        )
        config = T.InternVLConfig(
            vision_config={
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": [32, 32],
                "patch_size": [8, 8],
                **(vision or {}),
            },
            text_config={"model_type": "qwen2", **_text(**text)},
            downsample_ratio=0.5,
            image_token_id=WORDS.index("<IMG_CONTEXT>"),
        )
        return T.InternVLForConditionalGeneration(config).eval(), processor
    raise ValueError(family)


#: A prompt for each family (where its image token goes).
PROMPTS = {
    "llava": "USER: <image> what shape is this ? ASSISTANT:",
    "llava-next": "USER: <image> what shape is this ? ASSISTANT:",
    "paligemma": "<image> what shape is this ?",
    "qwen2-vl": "<|vision_start|><|image_pad|><|vision_end|> what shape is this ?",
    "qwen2.5-vl": "<|vision_start|><|image_pad|><|vision_end|> what shape is this ?",
    "idefics3": "<image> what shape is this ?",
    "internvl": "<IMG_CONTEXT> what shape is this ?",
}


def save(family: str, folder: Path, **kw: Any) -> Path:
    """The tiny model and its processor saved as ``folder`` (``--model hf:FOLDER``)."""
    model, processor = build(family, **kw)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
