"""Generative vision-language models (LLaVA, PaliGemma, Qwen2-VL): what the model looked at for each word
it says (``hookviz vlm``). :func:`hookviz.vlm.words.explain_words` makes the maps, :mod:`.families` places the
image tokens on the photo, :mod:`.pictures` draws them, :mod:`.run` writes a run."""
