"""The AlexeyAB fork's JSON results file: `detector test ... -out result.json`.

The fork's test_detector writes "[", then one object per image as its detection_to_json
(src/network.c) prints it with sprintf, joined by ", " lines, then "]": the same text
byte for byte here, so a script that parses (or diffs) the fork's file reads ours.

    {
     "frame_id":1,
     "filename":"data/dog.jpg",
     "objects": [
      {"class_id":16, "name":"dog", "relative_coordinates":{"center_x":0.288, ...},
       "confidence":0.81}   (one line in the file)
     ]
    }

An object per class above the threshold of each box (a box can be both car and truck), in
NMS's order, each box's classes ascending; numbers as C's %f (six decimals); the box
relative to the image and not clipped. One departure: the fork pastes names and paths in
unescaped, so a quote or backslash in them makes its file invalid JSON; here they are
escaped (other characters come out as given).
"""

import json

# The fork leaves out classes whose name starts with this (its names-file convention).
HIDDEN_PREFIX = "dont_show"
# detection_to_json's own floor; the detections' probabilities are already above -thresh.
JSON_THRESH = 0.005


def _text(value):
    return json.dumps(str(value), ensure_ascii=False)


def _object(class_id, name, box, confidence):
    x, y, w, h = (float(v) for v in box)
    return (
        f'  {{"class_id":{class_id}, "name":{_text(name)}, "relative_coordinates":'
        f'{{"center_x":{x:f}, "center_y":{y:f}, "width":{w:f}, "height":{h:f}}}, '
        f'"confidence":{float(confidence):f}}}'
    )


def image_entry(frame_id, filename, detections, names=None):
    """One image's object: detect()'s detections in NMS's order (darknet_order=True), each
    class of a box above JSON_THRESH; a class without a name is written as its number."""
    objects = []
    for d in detections:
        for class_id, prob in enumerate(d.probs):
            name = names[class_id] if names is not None and class_id < len(names) else str(class_id)
            if prob > JSON_THRESH and not name.startswith(HIDDEN_PREFIX):
                objects.append(_object(class_id, name, d.box, prob))
    return (
        f'{{\n "frame_id":{int(frame_id)}, \n "filename":{_text(filename)}, \n '
        f'"objects": [ \n' + ", \n".join(objects) + "\n ] \n}"
    )


def results_file(entries):
    """The whole file from image_entry()s, as the fork writes it (no newline at the end)."""
    return "[\n" + ", \n".join(entries) + "\n]"
