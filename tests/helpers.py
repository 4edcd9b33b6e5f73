"""What several test modules share: small cfgs, dataset writers and network helpers."""


# ---- the tiny two-class "bars" classifier (its dataset: the `bars` fixture in conftest.py) ----
CLASSIFIER_CFG = """
[net]
batch={batch}
subdivisions={subdivisions}
width=12
height=12
channels=1
learning_rate=0.05
momentum={momentum}
decay=0.0005
max_batches={max_batches}
policy=poly
power=2
min_crop=12
max_crop=14
flip=0

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=2
size=1
stride=1
pad=1
activation=linear

[avgpool]

[softmax]
"""


def write_classifier_cfg(tmp_path, name="tiny.cfg", batch=8, subdivisions=2, momentum=0.0,
                         max_batches=6, text=CLASSIFIER_CFG):
    path = tmp_path / name
    path.write_text(text.format(batch=batch, subdivisions=subdivisions, momentum=momentum,
                                max_batches=max_batches))
    return str(path)


def data_file(root, backup):
    path = backup.parent / f"{backup.name}.data"
    path.write_text(f"classes=2\ntrain={root}/train.list\nvalid={root}/valid.list\n"
                    f"names={root}/bars.names\nbackup={backup}/\n")
    return str(path)


class Lines(list):
    def __call__(self, line):
        self.append(line)
