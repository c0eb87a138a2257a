# SPDX-License-Identifier: Apache-2.0
"""Draws docs/layout.png (README "Layout transforms"): where the bytes of a head slice, a block-size
ratio and NHD -> HND go. Run: python docs/layout_figure.py (needs matplotlib)."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COLORS = plt.get_cmap("tab10")


def cell(ax, x, y, token, head, faded=False, label=None):
    """One (token, head) chunk of head_size x elem_size bytes: colour = the source head."""
    ax.add_patch(Rectangle((x, y), 1, 1, facecolor=COLORS(head % 10), alpha=0.25 if faded else 0.9,
                           edgecolor="black", linewidth=0.6))
    ax.text(x + 0.5, y + 0.5, label or f"t{token}\nh{head}", ha="center", va="center", fontsize=6)


def block(ax, x0, y, order, tokens, heads, token0, label, keep=None, dst_heads=None):
    """A block as its bytes in memory order, left to right; `keep` fades heads not moved."""
    ax.text(x0, y + 1.25, label, fontsize=8, va="bottom")
    i = 0
    outer = range(tokens) if order == "NHD" else range(heads)
    for o in outer:
        for n in (range(heads) if order == "NHD" else range(tokens)):
            t, h = (o, n) if order == "NHD" else (n, o)
            faded = keep is not None and h not in keep
            if dst_heads is None:
                cell(ax, x0 + i, y, token0 + t, h, faded)
            else:  # a destination head, coloured as the source head it came from
                cell(ax, x0 + i, y, token0 + t, dst_heads[h], label=f"t{token0 + t}\nh{h}<-{dst_heads[h]}")
            i += 1


def main():
    fig, axes = plt.subplots(3, 1, figsize=(11, 7.2))
    # 1. head slice: prefill TP=1 (4 heads) -> decode rank 1 of TP=2 (heads [2, 4) -> [0, 2))
    ax = axes[0]
    ax.set_title("Head slice: src heads [2, 4) of a 4-head block land in dst heads [0, 2) (decode TP 2, rank 1)",
                 fontsize=9, loc="left")
    block(ax, 0, 2, "NHD", 2, 4, 0, "src block, NHD, 2 tokens x 4 heads (faded heads stay behind)", keep={2, 3})
    block(ax, 0, 0, "NHD", 2, 2, 0, "dst block, NHD, 2 tokens x 2 heads", dst_heads={0: 2, 1: 3})
    # 2. block ratio: two 2-token src blocks fill one 4-token dst block, in token order
    ax = axes[1]
    ax.set_title("Block-size ratio: src blocks [5, 9] (2 tokens each) fill dst block [3] (4 tokens), in list order",
                 fontsize=9, loc="left")
    block(ax, 0, 2, "NHD", 2, 2, 0, "src block 5 (tokens 0-1)")
    block(ax, 5, 2, "NHD", 2, 2, 2, "src block 9 (tokens 2-3)")
    block(ax, 0, 0, "NHD", 4, 2, 0, "dst block 3, 4 tokens x 2 heads")
    # 3. NHD -> HND
    ax = axes[2]
    ax.set_title("NHD -> HND: the same (token, head) chunks, reordered head-major", fontsize=9, loc="left")
    block(ax, 0, 2, "NHD", 4, 2, 0, "src block, NHD [token, head, dim]")
    block(ax, 0, 0, "HND", 4, 2, 0, "dst block, HND [head, token, dim]")
    for ax in axes:
        ax.set_xlim(-0.2, 12.2)
        ax.set_ylim(-0.2, 3.8)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.text(0.01, 0.01, "Each cell: one head of one token (head_size x elem_size bytes); colour = source head, "
             "left to right = byte order in the block.", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(os.path.join(HERE, "layout.png"), dpi=110)


if __name__ == "__main__":
    main()
