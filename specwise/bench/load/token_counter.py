"""A local tokenizer for endpoint runs (`--tokenizer PATH`): counts tokens when a server
reports no usage, and cuts trace prompts to exact lengths. The in-process engine
brings its own tokenizer instead.
"""

from pathlib import Path

from specwise.errors import InputError


class LocalTokenizer:
    """`tokenizer.json` (or a directory holding one), read with the `tokenizers` library."""

    def __init__(self, path):
        from tokenizers import Tokenizer
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise InputError(f"{path}: no tokenizer.json here; pass a tokenizer.json file or "
                             "a Hugging Face model directory")
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as error:
            raise InputError(f"{file}: cannot read tokenizer ({error})") from None
        self.path = str(file)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)
