"""The learning check's cfg: the fork's stock yolov4-tiny.cfg with 3 classes at 160x160,
batch 32, ITERATIONS iterations (burn_in ITERATIONS/6, steps at 80% and 90%), mosaic off,
no pretrained weights. usage: python make_cfg.py STOCK_CFG OUT_CFG ITERATIONS [RATE]"""

import re
import sys

stock, out, iterations = sys.argv[1], sys.argv[2], int(sys.argv[3])
rate = sys.argv[4] if len(sys.argv) > 4 else "0.00261"
text = open(stock).read()
net = (
    f"[net]\nbatch=32\nsubdivisions=1\nwidth=160\nheight=160\nchannels=3\nmomentum=0.9\n"
    f"decay=0.0005\nangle=0\nsaturation=1.5\nexposure=1.5\nhue=.1\nlearning_rate={rate}\n"
    f"burn_in={iterations // 6}\nmax_batches={iterations}\npolicy=steps\n"
    f"steps={iterations * 8 // 10},{iterations * 9 // 10}\nscales=.1,.1\nmosaic=0\n\n"
)
body = text[text.index("[convolutional]") :]
body = body.replace("filters=255", "filters=24").replace("classes=80", "classes=3")
open(out, "w").write(net + re.sub(r"random=\d", "random=0", body))
