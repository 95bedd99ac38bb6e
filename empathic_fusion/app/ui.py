"""The Gradio app: a Text tab for a text model, a Clip tab for a fusion checkpoint (either or both).

Each tab shows its model card (empathic_fusion/evaluation/card.py), a banner when the model was trained on
generated data, a warning when its test report found it no better than the constant training mean, scores clipped to the label scale (saying when a raw score was outside it) and the
split-conformal interval the run calibrated on its validation split (empathic_fusion/evaluation/conformal.py).
Uploads are files on disk that Gradio streams there (refused past `max_upload_mb` while uploading); the
app reads them by path.

Works with the network off: analytics are off, no share link is made and the theme uses system
fonts (the default theme would fetch Google Fonts); Gradio serves its front end from the package.
"""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported

import tempfile  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402
import tqdm  # noqa: E402

from empathic_fusion.evaluation.card import FUSION_OUTPUT, ModelCard  # noqa: E402
from empathic_fusion.app.clip import ClipError, ClipScorer  # noqa: E402
from empathic_fusion.app.text import Score, TextModel, append_flag, persona_inputs  # noqa: E402
from empathic_fusion.evaluation.plots import empathy_timeline, save_figure  # noqa: E402

# The Clip tab's gr.Progress(track_tqdm=True) patches tqdm's methods to read a `_progress` that tqdm's patched
# __init__ sets. A bar made before that (an extraction or a training earlier in the same process) has none, and
# closing or collecting it raised AttributeError ("Exception ignored in: tqdm.__del__" at exit): a class default.
if not hasattr(tqdm.tqdm, "_progress"):
    tqdm.tqdm._progress = None

OFFLINE_THEME = gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"],
                                  font_mono=["ui-monospace", "Consolas", "monospace"])


def _card(card: ModelCard, prefix: str) -> None:
    """The demo banner (generated training data), the sanity warning (the model does not beat the constant
    training mean on its test split) and the model card."""
    if card.banner():
        gr.Markdown(card.banner(), elem_id=f"{prefix}-banner", elem_classes=["demo-banner"])
    if card.sanity:
        gr.Markdown(f"**{card.sanity}**", elem_id=f"{prefix}-sanity", elem_classes=["sanity-warning"])
    with gr.Accordion("Model card", open=True):
        gr.Markdown(card.markdown(), elem_id=f"{prefix}-card")


def _scale_text(card: ModelCard) -> str:
    return f"{card.scale[0]:g}-{card.scale[1]:g} scale" if card.scale else "scale unknown"


def _text_tab(scorer: TextModel, flag_csv: Path) -> None:
    _card(scorer.card, "text")
    gr.Markdown(f"Scores typed text with the text model: {', '.join(scorer.output_names)} "
                f"({_scale_text(scorer.card)} of its labels).")
    fields = [gr.Textbox(label=f, lines=4, elem_id=f"text-{f}") for f in scorer.inputs]
    if scorer.context_turns:  # raw turns; previous_turns is built from them as in training
        fields.append(gr.Textbox(label=f"earlier turns of this conversation, one per line, oldest first (the model "
                                       f"reads the last {scorer.context_turns}; empty = the first turn)",
                                 lines=3, elem_id="text-earlier-turns"))
    n_texts = len(fields)
    persona_spec = persona_inputs(scorer)
    persona_boxes = []
    if persona_spec:
        with gr.Accordion("Persona (as in training; empty = unknown)", open=True):
            for p in persona_spec:
                persona_boxes.append(gr.Dropdown([""] + p.choices, value="", label=p.column,
                                                 elem_id=f"persona-{p.column}")
                                     if p.choices is not None else  # a Textbox: gr.Number sends 0 for empty
                                     gr.Textbox(label=p.column, placeholder="a number; empty = unknown",
                                                elem_id=f"persona-{p.column}"))
    with gr.Row():
        submit = gr.Button("Score", variant="primary", elem_id="text-submit")
        clear = gr.ClearButton(fields + persona_boxes, value="Clear", elem_id="text-clear")
        flag = gr.Button("Flag", elem_id="text-flag")
    outputs = [gr.Number(label=name, interactive=False, precision=3, elem_id=f"score-{name}")
               for name in scorer.output_names]
    details = gr.Markdown(elem_id="text-details")
    clear.add(outputs + [details])
    status = gr.Markdown(elem_id="text-status")

    def split(values):
        texts = dict(zip(scorer.inputs, values[: len(scorer.inputs)]))
        earlier = str(values[len(scorer.inputs)] or "").splitlines() if scorer.context_turns else []
        persona = {}
        for p, v in zip(persona_spec, values[n_texts:]):
            v = None if v is None or str(v).strip() == "" else v
            if v is not None and p.choices is None:
                try:
                    v = float(v)
                except ValueError:
                    raise ValueError(f"persona '{p.column}': '{v}' is not a number (empty = unknown)") from None
            persona[p.column] = v
        return texts, earlier, persona

    def on_score(*values):
        try:
            texts, earlier, persona = split(values)
        except ValueError as error:
            return [None] * len(outputs) + ["", str(error)]
        if not any(t and t.strip() for t in texts.values()):
            return [None] * len(outputs) + ["", "Type some text first."]
        scores = scorer.score(texts, persona, earlier)
        notes = "".join(f"\n- {note}" for note in scorer.language_notes(texts))
        return ([round(scores[n].value, 3) for n in scorer.output_names]
                + [_score_details(scores, scorer.card) + notes, "scored"])

    def on_flag(*values):
        try:
            texts, earlier, persona = split(values)
        except ValueError as error:
            return str(error)
        if not any(t and t.strip() for t in texts.values()):
            return "Nothing to flag: type some text first."
        typed = {**texts, "earlier_turns": "\n".join(earlier)} if scorer.context_turns else texts
        append_flag(flag_csv, typed, persona,
                    {n: s.value for n, s in scorer.score(texts, persona, earlier).items()})
        return f"flagged (appended to {flag_csv.name})"

    inputs = fields + persona_boxes
    submit.click(on_score, inputs, outputs + [details, status])
    flag.click(on_flag, inputs, status)


def _score_details(scores: dict[str, Score], card: ModelCard) -> str:
    lines = [score.describe(name, card.scale) for name, score in scores.items()]
    if any(score.half_width is None for score in scores.values()):
        lines.append(card.interval_note)
    return "\n".join(f"- {line}" for line in lines)


def _clip_tab(scorer: ClipScorer) -> None:
    _card(scorer.card, "clip")
    gr.Markdown(f"Scores a recorded clip: {scorer.describe()}. Upload a video with sound (or a video and a "
                f"separate audio file), an optional transcript, and the story the person heard. "
                f"Uploads up to {scorer.max_upload_mb:g} MB.")
    with gr.Row():
        video = gr.File(label="video (with audio)", type="filepath", elem_id="clip-video")
        audio = gr.File(label="separate audio (optional)", type="filepath", elem_id="clip-audio")
        transcript_file = gr.File(label="transcript CSV (optional; docs/dataset.md)", type="filepath",
                                  elem_id="clip-transcript-file")
    transcript_text = gr.Textbox(label="or transcript as plain text (spread evenly over the clip)", lines=3,
                                 elem_id="clip-transcript-text")
    stories = scorer.stories()
    if stories:
        pick = gr.Dropdown([(f"{k}: {v[:70]}", k) for k, v in stories.items()], value=None,
                           label="pick a story of the dataset", elem_id="clip-story-pick")
    story = gr.Textbox(label="story text", lines=4, elem_id="clip-story")
    if stories:
        pick.change(lambda k: stories.get(k, ""), pick, story)
    submit = gr.Button("Score clip", variant="primary", elem_id="clip-submit")
    with gr.Row():
        rating = gr.Number(label=f"predicted empathy for the clip ({_scale_text(scorer.card)})", interactive=False,
                           precision=2, elem_id="clip-rating")
        status = gr.Markdown(elem_id="clip-status")
    timeline = gr.Image(label="predicted empathy per window; face found and speech beneath", type="filepath",
                        interactive=False, elem_id="clip-timeline")
    plots = Path(tempfile.mkdtemp(prefix="empathy-app-plots-"))

    def on_score(video_path, audio_path, transcript_path, text, story_text, progress=gr.Progress(track_tqdm=True)):
        if not video_path:
            return None, None, "**Upload a video first.**"
        transcript = Path(transcript_path) if transcript_path else (text or None)
        try:
            result = scorer.score(video_path, story_text, audio_path, transcript,
                                  progress=lambda fraction, message: progress(fraction, desc=message))
        except ClipError as error:
            return None, None, f"**Cannot score this upload:** {error}"
        card = scorer.card
        value, outside = card.clip(result.rating)
        score = Score(value, result.rating, outside, card.interval(FUSION_OUTPUT), card.coverage)
        seconds = result.window_seconds
        shown = np.clip(result.window_ratings, *card.scale) if card.scale else result.window_ratings
        fig = empathy_timeline({"clip": (seconds, shown)},
                               masks={"face found": result.face_found, "speech": result.speech}, fps=result.fps,
                               title=f"Predicted empathy per window (clip: {value:.2f})",
                               scale=scorer.model.rating_scale)
        path = save_figure(fig, plots / f"timeline-{uuid.uuid4().hex}.png")
        clipped = int((shown != result.window_ratings).sum())
        notes = [_score_details({"empathy": score}, card)]
        if clipped:
            notes.append(f"- {clipped} of {len(seconds)} window scores were outside the scale and are drawn clipped")
        notes += [f"- {w}" for w in result.warnings]
        windows = f"{len(seconds)} window{'' if len(seconds) == 1 else 's'}"
        return round(value, 2), str(path), f"scored {windows}\n" + "\n".join(notes)

    submit.click(on_score, [video, audio, transcript_file, transcript_text, story], [rating, timeline, status])


def build_app(text_scorer: TextModel | None = None, clip_scorer: ClipScorer | None = None,
              flag_csv: str | Path = "flagged.csv") -> gr.Blocks:
    """The Blocks app with a tab per loaded model."""
    if text_scorer is None and clip_scorer is None:
        raise ValueError("give a text model (text_ckpt_path=...), a fusion checkpoint (ckpt_path=...) or both")
    with gr.Blocks(title="empathic-fusion", analytics_enabled=False) as app:
        gr.Markdown("# empathic-fusion: predicted self-reported empathy")
        with gr.Tabs():
            if text_scorer is not None:
                with gr.Tab("Text", id="text"):
                    _text_tab(text_scorer, Path(flag_csv))
            if clip_scorer is not None:
                with gr.Tab("Clip", id="clip"):
                    _clip_tab(clip_scorer)
    return app


def launch(app: gr.Blocks, host: str, port: int | None, block: bool = True, max_upload_mb: float | None = None):
    """Serve locally: no share link, offline theme; uploads past `max_upload_mb` are refused while they
    stream to disk. Gradio's own start-up lines stay quiet (among them its tip to set share=True, which this
    app never does); with `block` the local URL is printed and the call serves until Ctrl+C. Returns
    (fastapi app, local url, share url)."""
    served = app.queue().launch(server_name=host, server_port=port, share=False, theme=OFFLINE_THEME,
                                prevent_thread_lock=True, quiet=True, footer_links=["settings"], allowed_paths=[],
                                max_file_size=f"{max_upload_mb:g}mb" if max_upload_mb else None)
    if block:
        print(f"* Running on local URL:  {served[1]}", flush=True)
        app.block_thread()
    return served


def models_from_config(cfg) -> tuple[TextModel | None, ClipScorer | None]:
    """The models serve.py's config names (conf/serve.yaml): checkpoint files or run folders (their best)."""
    text = TextModel(cfg.text_ckpt_path, cfg.accelerator) if cfg.text_ckpt_path else None
    clip = ClipScorer(cfg.ckpt_path, cfg.max_upload_mb, cfg.accelerator) if cfg.ckpt_path else None
    return text, clip
