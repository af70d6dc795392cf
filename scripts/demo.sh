#!/usr/bin/env bash
# make demo: pretrained weights where they can be had, otherwise an honest rerun with random weights.
set -u
hv=$1; out=$2
run() {
  "$hv" gradcam sample_images --model resnet18 --out "$out" --overwrite "$@" &&
  "$hv" featuremaps sample_images/cat.jpg --model resnet18 --layers 'layer*.0.conv1' --out "$out" --overwrite "$@"
}
run; rc=$?
if [ $rc -eq 3 ]; then
  echo
  echo "demo: the pretrained resnet18 weights could not be downloaded here, so the demo reruns with" >&2
  echo "demo: --weights none (RANDOM weights: the maps show the mechanics, not what a trained network sees)." >&2
  echo
  run --weights none; rc=$?
fi
if [ $rc -eq 0 ]; then
  # Detection, offline, with trained weights: the shapes detector the tests use (scripts/train_shapes_detector.py).
  "$hv" gradcam examples/shapes_scene.png --model examples/shapes_detector.py:make_detector \
    --weights tests/fixtures/shapes_detector.safetensors --labels examples/shapes_labels.txt \
    --method hirescam --method eigencam --out "$out" --overwrite; rc=$?
fi
if [ $rc -eq 0 ]; then
  report=$("$hv" report "$out" --title "hookviz demo: sample_images") || exit $?
  echo "demo: outputs are in $out/ (manifest: $out/manifest.jsonl)"
  echo "demo: browse them: $report"
fi
exit $rc
