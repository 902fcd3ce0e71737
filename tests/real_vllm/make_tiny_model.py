"""Build the tiny Llama the real-vLLM tests serve: no downloads, about 2 MB, a few seconds.

Run with the vLLM venv's own Python (it needs torch and transformers, which autotune never
depends on, and tokenizers)::

    <venv>/bin/python tests/real_vllm/make_tiny_model.py OUT_DIR [--foreign] [--size ...]

Writes a Hugging Face model folder (``config.json``, safetensors weights,
``generation_config.json``, tokenizer files with a chat template) and prints one JSON line
describing it. Shape from docs/vllm-cpu.md#3-the-tiny-test-model: head_dim 32 (vLLM's CPU
attention rejects 16 on the first request), a byte-level BPE vocabulary of 2000 shared by
model and tokenizer, KV of 2 layers x 2 KV heads x 32 x 2 (K, V) x 2 bytes = 512 B/token.
Deterministic for a seed.

``--foreign`` builds the same model with a tokenizer that shares nothing with autotune's word
list, as real users' tokenizers do not: BPE trained on syllable pseudo-words only (an English
word becomes several tokens), 1,900 tokens plus two special chat markers at 1900-1901, under a
``config.json`` vocab_size of 2048, so the largest ordinary id (1899) lies below vocab_size.

``--hidden-size``, ``--layers``, ``--heads`` (and ``--kv-heads``, ``--intermediate-size``) build
a larger model of the same family; the defaults are the tiny one above. ``--size tuning`` is
the size measured in docs/vllm-cpu.md#8-a-model-whose-step-time-grows-with-the-batch, at which
max_num_seqs and max_num_batched_tokens change throughput on a 2-core CPU. head_dim is
hidden_size / heads and must be one vLLM's CPU attention supports.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 2000
MAX_POSITIONS = 4096
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0, 1, 2, 3
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Common short English words: autotune's text prompts are made of such words (one per
# token in BPE vocabularies), so the trained vocabulary holds them as single tokens.
_WORD_TEXT = """
that with have this will your from they know want been good much some time very when come
here just like long make many more only over such take than them well were what also back
call came each even find give hand high keep kind last left life live look made most move
must name need next open part play said same seem show side tell turn used ways week went
work year area best body book both case city dark data days done door down draw easy else
face fact fall fast feel felt file fine fire form four free full game girl goes gone half
hard head hear held help hold home hope hour idea into item join land late lead less line
list lost love main mark mean meet mind miss near nice note once page paid past plan poor
pull push rate read real rest rich road rock role room rule safe sale save seen sell send
ship shop shot sign size slow soft sold song soon sort star stay step stop sure talk team
term test text then thus tiny told took tree true type unit upon user view wait walk wall
warm wear wide wife wind wish wood word wore yard yeah able away baby bank base beat bill
blue boat bond born busy card care cell cold cost crew deal deep deny desk diet drop duty
earn east edge ever exit farm fear feed fish flat food foot fund gain gift goal gold grow
hair hall hang hill the and for are but not you all any can her was one our out day get
has him his how man new now old see two way who boy did its let put say she too use
"""
_WORDS = _WORD_TEXT.split()


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Generated training text: word salad plus pseudo-words, digits and punctuation."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    pseudo = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(600)]
    out = []
    for _ in range(lines):
        words = [
            rng.choice(_WORDS) if rng.random() < 0.8 else rng.choice(pseudo)
            for _ in range(rng.randint(5, 30))
        ]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        line = " ".join(words)
        out.append(line[0].upper() + line[1:] + rng.choice(".?!,;:"))
    return out


# head_dim values vLLM 0.32's CPU attention accepts (docs/vllm-cpu.md#3-the-tiny-test-model)
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class Shape:
    """The transformer's size; the defaults are the tiny model every real-vLLM test serves."""

    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None  # None: heads / 2
    intermediate_size: int | None = None  # None: 2 x hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else max(1, self.heads // 2)

    def check(self) -> None:
        if self.hidden_size % self.heads:
            raise SystemExit(f"--hidden-size {self.hidden_size} is not a multiple of --heads")
        if self.head_dim not in CPU_HEAD_DIMS:
            raise SystemExit(
                f"head_dim {self.head_dim} (hidden_size / heads) is not one vLLM's CPU "
                f"attention supports: {CPU_HEAD_DIMS}"
            )
        if self.heads % self.num_kv_heads:
            raise SystemExit(f"--heads {self.heads} is not a multiple of --kv-heads")


# Named sizes: "tiny" is the default; "tuning" makes step time grow with the batch on a
# 2-core CPU (measured in docs/vllm-cpu.md#8-a-model-whose-step-time-grows-with-the-batch).
SIZES = {"tiny": Shape(), "tuning": Shape(hidden_size=256, layers=4, heads=4)}

FOREIGN_TOKENS = 1900
FOREIGN_VOCAB = 2048
FOREIGN_MARKERS = ("<|user|>", "<|assistant|>")  # special: ids 1900 and 1901
FOREIGN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def foreign_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Syllable pseudo-words ("zuhul belfin"), digits and punctuation; no English word."""
    rng = random.Random(seed + 1)
    onsets, vowels, codas = "bdfgjklmnprstvz", "aeiou", ["", "", "l", "n", "r", "s"]

    def word() -> str:
        return "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.randint(1, 4))
        )

    out = []
    for _ in range(lines):
        words = [word() for _ in range(rng.randint(5, 30))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        out.append(" ".join(words) + rng.choice(".?!,;:"))
    return out


def build(out: Path, seed: int, foreign: bool = False, shape: Shape = Shape()) -> dict[str, object]:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tokens = FOREIGN_TOKENS if foreign else VOCAB_SIZE
    trainer = trainers.BpeTrainer(
        vocab_size=tokens,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(foreign_corpus(seed) if foreign else corpus(seed), trainer=trainer)
    if bpe.get_vocab_size() != tokens:
        raise SystemExit(f"tokenizer vocabulary is {bpe.get_vocab_size()}, not {tokens}")
    if foreign:
        bpe.add_special_tokens(list(FOREIGN_MARKERS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    tok.chat_template = FOREIGN_TEMPLATE if foreign else CHAT_TEMPLATE
    tok.save_pretrained(out)
    vocab = FOREIGN_VOCAB if foreign else VOCAB_SIZE

    shape.check()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size or 2 * shape.hidden_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    cfg.dtype = torch.bfloat16
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3).save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {
        "path": str(out),
        "vocab_size": vocab,
        "tokenizer_size": len(tok),
        "foreign": foreign,
        "hidden_size": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "params": params,
        "kv_bytes_per_token": 2
        * cfg.num_hidden_layers
        * cfg.num_key_value_heads
        * cfg.head_dim
        * 2,
        "max_position_embeddings": MAX_POSITIONS,
        "bytes": sum(f.stat().st_size for f in out.iterdir() if f.is_file()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--foreign", action="store_true", help="a tokenizer foreign to autotune")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="a named shape")
    p.add_argument("--hidden-size", type=int, help="overrides the named size's")
    p.add_argument("--layers", type=int, help="overrides the named size's")
    p.add_argument("--heads", type=int, help="attention heads; head_dim = hidden / heads")
    p.add_argument("--kv-heads", type=int, help="default: heads / 2")
    p.add_argument("--intermediate-size", type=int, help="default: 2 x hidden size")
    ns = p.parse_args(argv)
    base = SIZES[ns.size]
    shape = Shape(
        hidden_size=ns.hidden_size or base.hidden_size,
        layers=ns.layers or base.layers,
        heads=ns.heads or base.heads,
        kv_heads=ns.kv_heads if ns.kv_heads is not None else base.kv_heads,
        intermediate_size=ns.intermediate_size or base.intermediate_size,
    )
    print(json.dumps(build(ns.out, ns.seed, ns.foreign, shape)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
