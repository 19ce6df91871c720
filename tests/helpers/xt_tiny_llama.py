"""Build a tiny local Llama, its BPE tokenizer and Alpaca-format rows: ``python xt_tiny_llama.py OUT [ROWS]``.

No hub access: the tokenizer is trained with ``tokenizers`` on the dataset's own text
(vocab ~300), the model is a random ``LlamaForCausalLM`` (hidden 32, one layer).
Writes ``OUT/model`` (model + tokenizer) and ``OUT/alpaca.jsonl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORDS = ("alpha beta gamma delta river stone cloud light green small quick fox jumps over lazy dog "
         "name three colors list two animals write short poem about sea count to five").split()


def rows(n: int = 96) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        w = [WORDS[(i * 7 + k) % len(WORDS)] for k in range(6)]
        out.append({"instruction": f"{w[0]} {w[1]} {w[2]} number {i}", "input": w[3] if i % 3 else "",
                    "output": " ".join(w[3:] + w[:2])})
    return out


def main(out: str, n_rows: int = 96) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = Path(out)
    (root / "model").mkdir(parents=True, exist_ok=True)
    data = rows(n_rows)
    with open(root / "alpaca.jsonl", "w") as f:
        for row in data:
            f.write(json.dumps(row) + "\n")
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(r.values()) for r in data[:96]] + ["Below is an instruction that describes a task. "
                                                     "### Instruction: ### Response: ### Input:"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", padding_side="right")
    fast.save_pretrained(root / "model")
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(root / "model")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
