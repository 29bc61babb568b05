"""Traffic generators behind one interface: XDP live frames (netns runs) and TRex (hardware runs)."""

from lab.bench.gen.base import IMIX, Endpoints, FrameSpec, Generator, GeneratorError, Latency, TrialResult, build_frame

__all__ = ["IMIX", "Endpoints", "FrameSpec", "Generator", "GeneratorError", "Latency", "TrialResult",
           "build_frame"]
