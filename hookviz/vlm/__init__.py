"""Generative vision-language models (LLaVA, PaliGemma, Qwen2-VL, ...): what the model looked at for each
word it says (``hookviz vlm``). :mod:`.model` loads a model and makes its answer,
:func:`hookviz.vlm.words.explain_words` makes the maps (the token methods, registered with their needs),
:mod:`.families` is the registry of families (:func:`~.families.register_family`), :mod:`.placement`
places their image tokens on the photo, :mod:`.pictures` draws them, :mod:`.inputs` is the input kind of
photos with a prompt, and :mod:`.run` is the ``vlm`` job and its :class:`hookviz.run.Run`
(:func:`.run.vlm_run`)."""
