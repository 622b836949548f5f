"""Idefics3's prompt layout of one image (`VisionSpec.prompt_layout == "tile_grid"`), in token ids, as
Idefics3Processor writes it in text and its tokenizer reads it:

    per row r, per column c:  <fake_token_around_image> <row_r_col_c> <image> x tokens_per_tile;  "\\n" after the row
    then "\\n" <fake_token_around_image> <global-img> <image> x tokens_per_tile <fake_token_around_image>

an image of one tile being only the global part, without the newlines. The special tokens split the text around
them, so the ids of each stretch of text between them ("\\n", "\\n\\n": a BPE merges the two) are what the tokenizer
gives that stretch alone. The ids come from the engine's tokenizer, as Idefics3Processor takes them from its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine_builder.formats.vision_spec import MAX_TILES_PER_SIDE
from engine_builder.util.errors import UnsupportedError

FAKE_TOKEN, GLOBAL_TOKEN = "<fake_token_around_image>", "<global-img>"


@dataclass(frozen=True)
class TileTokens:
    fake: int  # <fake_token_around_image>
    global_image: int  # <global-img>
    row_col: tuple[tuple[int, ...], ...]  # <row_{r+1}_col_{c+1}> at [r][c]
    newline: tuple[int, ...]  # "\n" between two rows
    rows_end: tuple[int, ...]  # "\n\n": after the last row, before the global image

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TileTokens:
        def token(text: str) -> int:
            found = tokenizer.convert_tokens_to_ids(text)
            if found is None or tokenizer.convert_ids_to_tokens(found) != text:
                raise UnsupportedError(f"the engine's tokenizer has no {text} token, which an Idefics3 prompt lays "
                                       "images out with; build the engine from the checkpoint's own tokenizer files")
            return found

        def text(s: str) -> tuple[int, ...]:
            return tuple(tokenizer(s, add_special_tokens=False).input_ids)

        return cls(fake=token(FAKE_TOKEN), global_image=token(GLOBAL_TOKEN),
                   row_col=tuple(tuple(token(f"<row_{r + 1}_col_{c + 1}>") for c in range(MAX_TILES_PER_SIDE))
                                 for r in range(MAX_TILES_PER_SIDE)),
                   newline=text("\n"), rows_end=text("\n\n"))

    def layout(self, rows: int, cols: int, image_token: int, tokens_per_tile: int) -> list[int]:
        """The ids of one image of ROWS x COLS tiles ((0, 0): one tile, its global image alone)."""
        tile = [image_token] * tokens_per_tile
        out: list[int] = []
        for r in range(rows):
            for c in range(cols):
                out += [self.fake, self.row_col[r][c], *tile]
            out += self.newline if r + 1 < rows else self.rows_end
        return [*out, self.fake, self.global_image, *tile, self.fake]
