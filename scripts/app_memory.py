"""Peak memory of scoring one long clip with the Clip tab's code (ClipScorer.score), for docs/app.md.

    python scripts/app_memory.py gen SECONDS WORKDIR          # a one-session demo clip (face, audio, transcript)
    python scripts/app_memory.py score CKPT SECONDS WORKDIR   # score it in this fresh process; prints peak RSS

Generation runs in its own process so that its memory does not count. CKPT: a fusion checkpoint or
run folder (make serve's logs/serve_demo/fusion)."""
import resource
import sys
import time
from pathlib import Path

root = Path(sys.argv[-1]) / f"clip_{sys.argv[-2]}"
if sys.argv[1] == "gen":
    from empathic_fusion.demo.generate import DemoConfig, generate_demo

    generate_demo(root, DemoConfig(n_participants=1, sessions_per_participant=1, story_share_s=float(sys.argv[2]),
                                   seed=5), workers=1)
    sys.exit()
from empathic_fusion.app.clip import ClipScorer

video, audio = root / "media" / "p001_s1.avi", root / "media" / "p001_s1.wav"
scorer = ClipScorer(sys.argv[2])
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = time.time()
result = scorer.score(video, "a story about a grandmother", audio=audio)
took = time.time() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
mb = (video.stat().st_size + audio.stat().st_size) / 2 ** 20
print(f"clip {result.window_seconds[-1] + 4:.0f} s ({mb:.0f} MB upload), {len(result.window_ratings)} windows: "
      f"peak RSS {peak:.0f} MB (model loaded: {loaded:.0f} MB), children {children:.0f} MB, {took:.0f} s")
