"""Write a small, deterministic EmpathicStories++-style dataset with real media files.

Latent model (documented in docs/demo_dataset.md): for session s of participant p and read story j,

    v_sj = u_v[s] + d_v[s, j]        visual engagement  (smile, nods, brow raises)
    a_sj = u_a[s] + d_a[s, j]        vocal engagement   (pitch level and range, loudness)
    t_sj = +1 if story j shares the topic of the participant's own story, else -1
           (shown in the text: the own story's and the reflection's wording)
    e_sj = w_v v_sj + w_a a_sj + w_t t_sj + w_p (trait_empathy_p - 3) + noise
    rating = 1 + number of cut points below e_sj / sd(e)     (1..5, skewed towards high ratings)

The Story Share phase shows the session-level parts (u_v, u_a, the own story's topic); the
Reflection on story j shows v_sj, a_sj and whether the participant relates to it. Each modality
carries part of the signal and none carries all of it.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tqdm import tqdm

from empathic_fusion.config.demo import MIN_UTTERANCE_S, DemoConfig  # noqa: F401  (MIN_UTTERANCE_S re-exported)
from empathic_fusion.core.files import respect_umask
from empathic_fusion.dataset.scale import TRAIT_SCALE
from empathic_fusion.demo import text as bank
from empathic_fusion.demo.face import write_face_video
from empathic_fusion.demo.speech import SAMPLE_RATE, Voice, synthesize_track, write_wav

GENERATOR_VERSION = 1
CUT_POINTS = (-1.5, -0.7, 0.1, 0.9)  # in units of sd(e): about 7/17/30/28/18 % of ratings 1..5


def _sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-x))


def _utterance(start: float, end: float, speaker: str, phase: str, text: str, story_id: str = "") -> dict:
    return {"start": round(start, 3), "end": round(end, 3), "speaker": speaker, "phase": phase,
            "story_id": story_id, "text": text}


def _split_span(start: float, end: float, n: int, gap: float = 0.4) -> list[tuple[float, float]]:
    """n consecutive utterance spans filling [start, end] with short pauses."""
    edges = np.linspace(start, end, n + 1)
    return [(float(a), float(b - gap if i < n - 1 else b)) for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]


def _plan_session(cfg: DemoConfig, rng: np.random.Generator, own_topic: str, reads: list[tuple[str, str, bool]],
                  engagement: dict) -> tuple[list[dict], list[tuple[float, float, str]]]:
    """Transcript rows and the engagement key of each participant speech/face segment."""
    rows: list[dict] = []
    segments: list[tuple[float, float, str]] = []  # (start, end, engagement key) for participant behaviour
    t = 0.0
    agent_end = t + cfg.warm_up_s * 0.5
    rows.append(_utterance(t, agent_end, "agent", "warm_up", bank.AGENT_LINES["warm_up"]))
    rows.append(_utterance(agent_end + 0.2, t + cfg.warm_up_s, "participant", "warm_up", bank.AGENT_LINES["warm_up_reply"]))
    segments.append((agent_end + 0.2, t + cfg.warm_up_s, "neutral"))
    t += cfg.warm_up_s + 0.3
    rows.append(_utterance(t, t + 2.0, "agent", "story_share", bank.AGENT_LINES["story_share"]))
    t += 2.2
    sentences = bank.own_story(own_topic, 4, rng)
    for (a, b), sentence in zip(_split_span(t, t + cfg.story_share_s, len(sentences)), sentences):
        rows.append(_utterance(a, b, "participant", "story_share", sentence))
    segments.append((t, t + cfg.story_share_s, "share"))
    t += cfg.story_share_s + 0.3
    rows.append(_utterance(t, t + cfg.story_receive_s, "agent", "story_receive", bank.AGENT_LINES["story_receive"]))
    t += cfg.story_receive_s + 0.3
    for story_id, story_topic, relates in reads:
        rows.append(_utterance(t, t + 2.0, "agent", "reflection", bank.AGENT_LINES["reflection"], story_id))
        t += 2.2
        span = cfg.reflection_s - 2.2
        for (a, b), sentence in zip(_split_span(t, t + span, 2), bank.reflection(story_topic, relates, rng)):
            rows.append(_utterance(a, b, "participant", "reflection", sentence, story_id))
        segments.append((t, t + span, story_id))
        t += span + 0.3
    rows.append(_utterance(t, t + cfg.cool_down_s * 0.6, "agent", "cool_down", bank.AGENT_LINES["cool_down"]))
    rows.append(_utterance(t + cfg.cool_down_s * 0.6 + 0.1, t + cfg.cool_down_s, "participant", "cool_down",
                           bank.AGENT_LINES["cool_down_reply"]))
    segments.append((t + cfg.cool_down_s * 0.6 + 0.1, t + cfg.cool_down_s, "neutral"))
    return rows, segments


def _face_controls(n_frames: int, fps: float, segments: list[tuple[float, float, str]], engagement: dict,
                   mouth: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per-frame face controls: engagement raises smile, nod amplitude and brow raises."""
    times = np.arange(n_frames) / fps
    level = np.full(n_frames, 0.5 * _sigmoid(-1.0))  # listening/reading: mostly neutral
    for start, end, key in segments:
        inside = (times >= start - 0.5) & (times < end + 0.5)
        level[inside] = _sigmoid(1.6 * engagement.get(key, 0.0))
    level = np.convolve(level, np.ones(7) / 7, mode="same")
    slow = lambda scale, period: scale * np.sin(2 * np.pi * times / period + rng.uniform(0, 2 * np.pi))  # noqa: E731
    brow = np.zeros(n_frames)
    for onset in np.flatnonzero(rng.random(n_frames) < 0.02 * level):
        brow[onset:onset + int(fps * 0.6)] = np.maximum(brow[onset:onset + int(fps * 0.6)], level[onset])
    blink = np.ones(n_frames)
    for onset in np.flatnonzero(rng.random(n_frames) < 1.0 / (4.0 * fps)):
        blink[onset:onset + 3] = 0.0
    nod = 9.0 * level * np.sin(2 * np.pi * 0.9 * times) * (rng.random() * 0.3 + 0.85)
    return {
        "smile": np.clip(level * (0.85 + 0.15 * np.sin(2 * np.pi * times / 3.1)), 0, 1),
        "mouth_open": np.clip(mouth, 0, 1),
        "brow_raise": np.clip(np.convolve(brow, np.ones(3) / 3, mode="same"), 0, 1),
        "eye_open": blink,
        "yaw": slow(7.0, 7.3) + slow(3.0, 2.9),
        "pitch": nod + slow(3.0, 5.1),
        "roll": slow(4.0, 6.7),
        "shift_x": slow(0.03, 9.1),
        "shift_y": slow(0.02, 8.3),
        "face_visible": np.ones(n_frames),
    }


def _render_session(job: dict) -> str:
    """Render one session's video and audio (runs in a worker process)."""
    rng = np.random.default_rng(job["seed"])
    duration = job["duration"]
    participant_segments = [(a, b, Voice(**v)) for a, b, v in job["participant_voice"]]
    agent_segments = [(a, b, Voice(**v)) for a, b, v in job["agent_voice"]]
    own, envelope = synthesize_track(duration, participant_segments, seed=job["seed"])
    robot, _ = synthesize_track(duration, agent_segments, seed=job["seed"] + 1)
    audio = np.clip(own + 0.6 * robot, -1.0, 1.0).astype(np.float32)
    write_wav(Path(job["audio_path"]), audio, SAMPLE_RATE)
    n_frames = int(round(duration * job["fps"]))
    frame_samples = (np.arange(n_frames) / job["fps"] * SAMPLE_RATE).astype(int).clip(0, len(envelope) - 1)
    mouth = envelope[frame_samples]
    controls = _face_controls(n_frames, job["fps"], job["segments"], job["engagement"], mouth, rng)
    write_face_video(Path(job["video_path"]), controls, fps=job["fps"], size=job["frame_size"])
    return job["session_id"]


def _participant_voice(base_f0: float, vocal: float) -> dict:
    return {"f0_hz": base_f0 * (1.0 + 0.12 * float(np.tanh(vocal))),
            "pitch_range": float(0.06 + 0.3 * _sigmoid(1.5 * vocal)),
            "loudness": float(np.clip(0.16 * np.exp(0.45 * vocal), 0.03, 0.6))}


def plan_demo(cfg: DemoConfig) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame], list[dict]]:
    """All tables, transcripts and per-session render jobs, from the seed alone."""
    rng = np.random.default_rng(cfg.seed)
    stories = bank.story_texts(rng)
    story_table = pd.DataFrame({"story_id": [f"st{i:03d}" for i in range(len(stories))],
                                "topic": [topic for topic, _ in stories], "text": [text for _, text in stories]})
    topics = list(bank.TOPICS)
    participants, sessions, ratings, latents, jobs = [], [], [], [], []
    transcripts: dict[str, pd.DataFrame] = {}
    for p in range(cfg.n_participants):
        pid = f"p{p + 1:03d}"
        trait = float(np.clip(np.round(rng.normal(3.4, 0.9)), TRAIT_SCALE.low, TRAIT_SCALE.high))
        big5 = np.round(rng.uniform(1.5, 4.8, size=5) * 4) / 4
        participants.append({"participant_id": pid, **dict(zip(
            ["big5_openness", "big5_conscientiousness", "big5_extraversion", "big5_agreeableness", "big5_neuroticism"],
            big5)), "trait_empathy": trait})
        base_f0 = float(rng.uniform(120, 230))
        for s in range(cfg.sessions_per_participant):
            sid = f"{pid}_s{s + 1}"
            own_topic = str(rng.choice(topics))
            u_v, u_a = rng.normal(size=2)
            reads = []
            chosen: set[str] = set()
            for _ in range(cfg.stories_per_session):
                want_own = rng.random() < cfg.own_topic_probability
                pool = story_table[(story_table.topic == own_topic) == want_own]
                pool = pool[~pool.story_id.isin(chosen)]
                row = pool.iloc[int(rng.integers(len(pool)))]
                chosen.add(row.story_id)
                reads.append((row.story_id, row.topic, row.topic == own_topic))
            engagement = {"neutral": 0.0, "share": float(u_v)}
            vocal = {"neutral": 0.0, "share": float(u_a)}
            for story_id, _, relates in reads:
                v = u_v + rng.normal(0, cfg.story_deviation_sd)
                a = u_a + rng.normal(0, cfg.story_deviation_sd)
                engagement[story_id], vocal[story_id] = float(v), float(a)
                t = 1.0 if relates else -1.0
                e = (cfg.weight_video * v + cfg.weight_audio * a + cfg.weight_text * t
                     + cfg.weight_trait * (trait - 3.0) + rng.normal(0, cfg.noise_sd))
                latents.append({"session_id": sid, "story_id": story_id, "video": v, "audio": a, "text": t,
                                "trait": trait - 3.0, "latent": e})
            rows, segments = _plan_session(cfg, rng, own_topic, reads, engagement)
            transcripts[sid] = pd.DataFrame(rows)
            duration = max(r["end"] for r in rows) + 0.5
            jobs.append({
                "session_id": sid, "seed": int(rng.integers(2**31)), "duration": duration, "fps": cfg.fps,
                "frame_size": cfg.frame_size, "segments": segments, "engagement": engagement,
                "participant_voice": [(a, b, _participant_voice(base_f0, vocal[key])) for a, b, key in segments],
                "agent_voice": [(r["start"], r["end"], {"f0_hz": 118.0, "pitch_range": 0.05, "loudness": 0.12})
                                for r in rows if r["speaker"] == "agent"],
            })
            sessions.append({"session_id": sid, "participant_id": pid, "video": f"media/{sid}.avi",
                             "audio": f"media/{sid}.wav"})
    latent = pd.DataFrame(latents)
    spread = latent.latent.std()
    latent["empathy"] = 1 + np.searchsorted(np.array(CUT_POINTS) * spread, latent.latent.to_numpy())
    ratings = latent[["session_id", "story_id", "empathy"]]
    tables = {"participants": pd.DataFrame(participants), "sessions": pd.DataFrame(sessions),
              "stories": story_table[["story_id", "text"]], "ratings": ratings, "latent": latent}
    return tables, transcripts, jobs


def generate_demo(out: str | Path, cfg: DemoConfig = DemoConfig(), workers: int = 2, force: bool = False) -> Path:
    """Write the dataset to out (atomically); reuse an existing one made with the same config."""
    out = Path(out)
    stamp = {"generator_version": GENERATOR_VERSION, "config": asdict(cfg)}
    stamp_path = out / "generator.json"
    if not force and stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return out
    tables, transcripts, jobs = plan_demo(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    respect_umask(work, directory=True)  # a lab's shared demo folder stays readable to colleagues
    try:
        (work / "media").mkdir()
        (work / "transcripts").mkdir()
        (work / "dataset.yaml").write_text(yaml.safe_dump({"name": "demo", "fps": cfg.fps, "generated": True}))
        for name, table in tables.items():
            table.to_csv(work / f"{name}.csv", index=False)
        for sid, transcript in transcripts.items():
            transcript.to_csv(work / "transcripts" / f"{sid}.csv", index=False)
        for job in jobs:
            job["video_path"] = str(work / "media" / f"{job['session_id']}.avi")
            job["audio_path"] = str(work / "media" / f"{job['session_id']}.wav")
        progress = tqdm(total=len(jobs), desc="demo sessions", unit="session")
        if workers > 1:
            with get_context("spawn").Pool(workers) as pool:
                for _ in pool.imap_unordered(_render_session, jobs):
                    progress.update()
        else:
            for job in jobs:
                _render_session(job)
                progress.update()
        progress.close()
        stamp_path_tmp = work / "generator.json"
        stamp_path_tmp.write_text(json.dumps(stamp, indent=1))
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--participants", type=int, default=DemoConfig.n_participants)
    parser.add_argument("--sessions", type=int, default=DemoConfig.sessions_per_participant)
    parser.add_argument("--seed", type=int, default=DemoConfig.seed)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    cfg = DemoConfig(n_participants=args.participants, sessions_per_participant=args.sessions, seed=args.seed)
    print(generate_demo(args.out, cfg, workers=args.workers, force=args.force))


if __name__ == "__main__":
    main()
