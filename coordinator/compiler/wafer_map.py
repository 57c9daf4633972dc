"""placement.png: the wafer with each kernel's rectangle, numbered and listed in a legend.

Left: the whole wafer. Right: a zoom on the cores in use (small models use a corner).
Multireplica: every replica's rectangles in its kernels' colours, each replica's tile
outlined; the legend lists replica 0's rectangles.
"""
from __future__ import annotations

import io
from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

from coordinator.compiler.placement import Rect, RouteSpec
from wafer.fabric import Fabric

PANEL = 520  # pixels per panel side
LEGEND_WIDTH = 420
PALETTE = [(78, 121, 167), (242, 142, 43), (225, 87, 89), (118, 183, 178), (89, 161, 79),
           (237, 201, 72), (176, 122, 161), (255, 157, 167), (156, 117, 95), (186, 176, 172)]


def _panel(draw: ImageDraw.ImageDraw, origin: tuple[int, int], view: Rect, rects: Sequence[Rect],
           routes: Sequence[RouteSpec], names: Sequence[str], font, title: str,
           offsets: Sequence[tuple[int, int]], tile: tuple[int, int] | None) -> None:
    ox, oy = origin
    scale = min(PANEL / view.width, PANEL / view.height)

    def px(x: float, y: float) -> tuple[float, float]:
        return ox + (x - view.x) * scale, oy + 20 + (y - view.y) * scale

    draw.text((ox, oy), title, fill="black", font=font)
    draw.rectangle([px(view.x, view.y), px(view.x + view.width, view.y + view.height)],
                   fill=(235, 235, 235), outline="black")
    index = {n: i for i, n in enumerate(names)}
    for dx, dy in offsets:
        if tile is not None and len(offsets) > 1:
            draw.rectangle([px(dx, dy), px(dx + tile[0], dy + tile[1])], outline=(90, 90, 90))
        for i, r in enumerate(rects):
            color = PALETTE[i % len(PALETTE)]
            a, b = px(r.x + dx, r.y + dy), px(r.x + dx + r.width, r.y + dy + r.height)
            draw.rectangle([a, (max(b[0], a[0] + 1), max(b[1], a[1] + 1))], fill=color,
                           outline="black" if b[0] - a[0] > 4 else None)
            if b[0] - a[0] > 14 and b[1] - a[1] > 10:
                draw.text((a[0] + 2, a[1] + 1), str(i + 1), fill="white", font=font)
    for route in routes:
        if route.src in index and route.dst in index:  # kernel to kernel
            draw.line([px(x + 0.5, y + 0.5) for x, y in route.path], fill=(40, 40, 40), width=1)


def render(fabric: Fabric, names: Sequence[str], types: Sequence[str], rects: Sequence[Rect],
           routes: Sequence[RouteSpec], title: str,
           offsets: Sequence[tuple[int, int]] = ((0, 0),),
           tile: tuple[int, int] | None = None) -> bytes:
    """The wafer map as PNG bytes: `rects` (replica 0's) at each replica's offset."""
    font = ImageFont.load_default()
    image = Image.new("RGB", (2 * PANEL + LEGEND_WIDTH + 40, PANEL + 60), "white")
    draw = ImageDraw.Draw(image)
    wafer = Rect(0, 0, fabric.width, fabric.height)
    used = Rect(0, 0, max(r.x + r.width + dx for r in rects for dx, _ in offsets),
                max(r.y + r.height + dy for r in rects for _, dy in offsets))
    side = max(used.width, used.height)
    zoom = Rect(0, 0, min(side, fabric.width), min(side, fabric.height))
    _panel(draw, (10, 10), wafer, rects, routes, names, font,
           f"{title}: wafer {fabric.name} {fabric.width} x {fabric.height} cores", offsets, tile)
    _panel(draw, (PANEL + 20, 10), zoom, rects, routes, names, font,
           f"zoom: cores (0,0)-({zoom.width},{zoom.height})", offsets, tile)
    x0 = 2 * PANEL + 30
    heading = "kernel  type  rectangle (x,y w x h)"
    if len(offsets) > 1:
        heading = (f"{len(offsets)} replicas, tiles of {tile[0]} x {tile[1]} cores"
                   if tile else f"{len(offsets)} replicas") + "; replica 0: " + heading
    draw.text((x0, 10), heading, fill="black", font=font)
    for i, (name, type_, r) in enumerate(zip(names, types, rects)):
        y = 30 + 14 * i
        if y > PANEL + 40:
            draw.text((x0, y), f"... {len(names) - i} more", fill="black", font=font)
            break
        draw.rectangle([x0, y + 2, x0 + 9, y + 11], fill=PALETTE[i % len(PALETTE)])
        label = name if name == type_ else f"{name} ({type_})"
        draw.text((x0 + 14, y), f"{i + 1} {label} {r.x},{r.y} {r.width}x{r.height}",
                  fill="black", font=font)
    png = io.BytesIO()
    image.save(png, format="PNG")
    return png.getvalue()
