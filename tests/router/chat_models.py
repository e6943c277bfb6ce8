"""Real models' chat templates and a tiny real tokenizer, for the router's chat-template tests.

data/model_tokenizer_configs.json holds, per model, the tokenizer_config.json fields the router reads:
the special tokens and the chat template, each template verbatim from the model's Hugging Face
repository (Llama-3.1-8B-Instruct, Qwen2.5-7B-Instruct, DeepSeek-R1, Mistral-7B-Instruct-v0.3; copied
from public sources that quote them, nothing downloaded). The tokenizer is a byte-level BPE trained
here on a few sentences, with every template marker as a special token and a post-processor that
adds <s>, so that add_special_tokens=True and False give different ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CONFIGS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "model_tokenizer_configs.json").read_text(encoding="utf-8")
)
MODELS = sorted(CONFIGS)
SPECIALS = [
    "<s>", "</s>", "<unk>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
]  # fmt: skip
CORPUS = [
    "You are a helpful assistant. What is the capital of France? Paris is the capital of France.",
    "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 Environment: ipython",
    "get_weather location unit celsius fahrenheit tool_call arguments parameters function name",
    "Given the following functions, please respond with a JSON for a function call. Do not use variables.",
    '{"name": "get_weather", "arguments": {"location": "Paris"}} <think> reasoning </think> answer',
]


def write_tokenizer(path: Path) -> Path:
    """A byte-level BPE tokenizer.json at `path`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(CORPUS * 4, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    tok.save(str(path))
    return path


def model_dir(root: Path, model: str, *, jinja_file: str | None = None, drop_config_template: bool = False) -> Path:
    """A model directory as the Hub has it: tokenizer.json, tokenizer_config.json, maybe chat_template.jinja."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root / "tokenizer.json")
    config = dict(CONFIGS[model])
    if drop_config_template:
        config.pop("chat_template")
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if jinja_file is not None:
        (root / "chat_template.jinja").write_text(jinja_file, encoding="utf-8")
    return root
