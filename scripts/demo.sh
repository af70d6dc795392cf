#!/usr/bin/env bash
# make demo: a trained network's maps. resnet18's pretrained weights where they can be downloaded; otherwise
# EfficientNet-Lite0, trained on ImageNet, whose weights hookviz[demo] installs (no download at run time).
set -u
hv=$1; out=$2
model=resnet18; layers=(--layers 'layer*.0.conv1')
methods=(--method gradcam --method gradcampp --method layercam)
"$hv" gradcam sample_images --model "$model" "${methods[@]}" --out "$out" --overwrite; rc=$?
if [ $rc -eq 3 ]; then
  model=efficientnet_lite0; layers=(--layers _conv_stem --layers _blocks.1._project_conv)
  echo >&2
  echo "demo: resnet18's pretrained weights could not be downloaded here; the demo uses $model instead:" >&2
  echo "demo: trained on ImageNet (top-1 75.1 % published), its weights packaged by hookviz[demo]." >&2
  echo >&2
  "$hv" gradcam sample_images --model "$model" "${methods[@]}" --out "$out" --overwrite; rc=$?
fi
if [ $rc -eq 0 ]; then
  "$hv" featuremaps sample_images/cat.jpg --model "$model" "${layers[@]}" --out "$out" --overwrite; rc=$?
fi
if [ $rc -eq 0 ]; then
  # Detection, offline, with trained weights: the shapes detector the tests use (scripts/train_shapes_detector.py).
  "$hv" gradcam examples/shapes_scene.png --model examples/shapes_detector.py:make_detector \
    --weights tests/fixtures/shapes_detector.safetensors --labels examples/shapes_labels.txt \
    --method hirescam --method eigencam --out "$out" --overwrite; rc=$?
fi
if [ $rc -eq 0 ]; then
  report=$("$hv" report "$out" --title "hookviz demo: sample_images ($model)") || exit $?
  echo "demo: the model: $model (trained on ImageNet); outputs are in $out/ (manifest: $out/manifest.jsonl)"
  echo "demo: browse them: $report"
fi
exit $rc
