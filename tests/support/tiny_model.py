"""Build a tiny random-weight causal LM plus tokenizer, entirely offline.

`build_tiny_model(path)` writes a Hugging Face style model directory that `vllm serve`
(CPU build) and `vllm bench serve --tokenizer` can load with HF_HUB_OFFLINE=1:

- a byte-level BPE tokenizer trained with `tokenizers` on a deterministic synthetic corpus
  (every byte string is encodable, so any prompt text works), saved as tokenizer.json plus a
  `PreTrainedTokenizerFast` tokenizer_config.json;
- a `LlamaForCausalLM` with random weights from a fixed seed, saved as safetensors.

The model's geometry is chosen for vLLM's CPU attention backend: head_dim 64 (a supported
head size, multiple of 32), 2 KV heads, 2 layers. Output is gibberish but deterministic, which
is all a token-for-token comparison needs. Building takes a few seconds and ~10 MB on disk.

Run as a script to build into a directory: `python tests/support/tiny_model.py /tmp/tiny-llama`.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 2048
MAX_POSITIONS = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

# Marker written last; its presence means the directory is complete.
_DONE = ".tiny-model-complete"


def _corpus(seed: int = SEED, n_lines: int = 4000) -> list[str]:
    """Deterministic pseudo-English text for BPE training (no external data)."""
    rng = random.Random(seed)
    syllables = (
        "ka lo mi ne ru ta shi po ve da on er in at the and ing ion re st al or en is it ar ou"
    )
    syllables_list = syllables.split(" ")
    words = [
        "".join(rng.choice(syllables_list) for _ in range(rng.randint(1, 4))) for _ in range(600)
    ]
    words += ["hello", "world", "prefill", "decode", "token", "cache", "model", "serve"]
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 16)
        line = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            line = line.capitalize() + rng.choice([".", "!", "?", ","])
        if rng.random() < 0.2:
            line += " " + str(rng.randint(0, 99999))
        lines.append(line)
    return lines


def _build_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    # A minimal chat template so the chat completions endpoint also works.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(str(path))


def _build_model(path: Path, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    # Larger-than-default init so the logits are far from flat: greedy decoding then has
    # clear winners and does not hinge on float rounding ties.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True)


def build_tiny_model(path: str | os.PathLike[str]) -> Path:
    """Write the tiny model + tokenizer into `path` (created if needed) and return it.

    Idempotent: a directory that already holds a complete build is returned unchanged.
    Needs only `torch`, `transformers` and `tokenizers`; never touches the network.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = Path(path)
    if (out / _DONE).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)

    _build_tokenizer(out)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    _build_model(
        out,
        vocab_size=len(tok),
        bos_id=tok.bos_token_id,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
    )
    gen_cfg = out / "generation_config.json"
    if gen_cfg.exists():
        # Keep vLLM's default sampling params neutral (no model-specified overrides).
        data = json.loads(gen_cfg.read_text())
        data = {k: v for k, v in data.items() if k.endswith("token_id") or k.startswith("_")}
        gen_cfg.write_text(json.dumps(data, indent=2) + "\n")
    (out / _DONE).write_text("ok\n")
    return out


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiny-llama"
    print(build_tiny_model(target))
