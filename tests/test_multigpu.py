"""Data-parallel training over NCCL on 2 GPUs (make gpu-test on a machine with >= 2 GPUs and
NCCL: pip install '.[multigpu]'). Skipped elsewhere, with the reason."""

import multiprocessing

import numpy as np
import pytest
from helpers import darknet_py, data_file, finish, weights_floats, write_run_cfg

from darknet_py.backends import cuda_device_count
from darknet_py.distributed.comm import free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multigpu,
    pytest.mark.skipif(cuda_device_count() < 2, reason="needs 2 CUDA GPUs (and PyCUDA, NCCL)"),
]


def _nccl_rank(rank, port, results):
    from darknet_py.backends import get_backend
    from darknet_py.distributed.launcher import connect

    comm = connect(rank, 2, f"cuda:{rank}", ("127.0.0.1", port), timeout=60)
    be = get_backend(f"cuda:{rank}")
    summed = be.from_host(np.arange(1000, dtype=np.float32) * (rank + 1))
    empty = be.zeros(0)
    shared = be.from_host(np.full(7, 10.0 * rank + 3, dtype=np.float32))
    comm.all_reduce_sum(be, [summed, empty])
    comm.broadcast(be, [shared])
    comm.barrier(timeout=30)
    results.put((rank, be.to_host(summed), be.to_host(shared), comm.sum_value(be, rank + 1)))
    comm.close()


def test_nccl_sums_and_broadcasts_device_arrays():
    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), free_port()
    ranks = [context.Process(target=_nccl_rank, args=(r, port, results)) for r in (0, 1)]
    for p in ranks:
        p.start()
    got = sorted(results.get(timeout=120) for _ in ranks)
    for p in ranks:
        p.join(30)
        assert p.exitcode == 0
    for _rank, summed, shared, total in got:
        np.testing.assert_array_equal(summed, np.arange(1000) * 3)
        np.testing.assert_array_equal(shared, np.full(7, 3.0))  # rank 0's
        assert total == 3


def test_two_gpus_train_like_two_cpu_ranks(bars, tmp_path):
    cfg = write_run_cfg(tmp_path)
    gpu = finish(
        darknet_py("train", cfg, data_file(bars, tmp_path / "gpu"), "--gpus", "0,1", "--seed", 3)
    )
    cpu = finish(
        darknet_py("train", cfg, data_file(bars, tmp_path / "cpu"), "--ranks", 2, "--seed", 3)
    )
    assert gpu[0] == 0, gpu[2]
    assert cpu[0] == 0, cpu[2]
    seen_gpu, w_gpu = weights_floats(tmp_path / "gpu" / "tiny_final.weights")
    seen_cpu, w_cpu = weights_floats(tmp_path / "cpu" / "tiny_final.weights")
    assert seen_gpu == seen_cpu == 32
    np.testing.assert_allclose(w_gpu, w_cpu, rtol=1e-4, atol=1e-5)


def test_a_gpu_that_does_not_exist_is_one_line(bars, tmp_path):
    cfg = write_run_cfg(tmp_path)
    code, _, err = finish(
        darknet_py(
            "train", cfg, data_file(bars, tmp_path / "b"), "--gpus", f"0,{cuda_device_count()}"
        )
    )
    assert code == 2
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            f"GPU {cuda_device_count()} (local rank 1) does not exist; this machine has "
            f"{cuda_device_count()} GPUs (0-{cuda_device_count() - 1})"
        )
    )


def _train_gpus(bars, tmp_path, name, *args):
    cfg = write_run_cfg(tmp_path)
    code, _, err = finish(
        darknet_py(
            "train", cfg, data_file(bars, tmp_path / name), "--gpus", "0,1", "--seed", 3, *args
        )
    )
    assert code == 0, err
    return weights_floats(tmp_path / name / "tiny_final.weights")


def test_overlapped_exchange_gives_the_weights_of_the_exchange_after_the_backward(bars, tmp_path):
    # 104-byte buckets: each update buffer summed on the NCCL stream as soon as its layer's
    # backward is done, the passes replayed as one CUDA graph per piece. On 2 ranks each sum
    # is a + b either way, so the weights agree bit for bit.
    after = _train_gpus(bars, tmp_path, "after", "--bucket-mb", "0")
    overlapped = _train_gpus(bars, tmp_path, "overlapped", "--bucket-mb", "0.0001")
    assert after[0] == overlapped[0] == 32
    np.testing.assert_array_equal(overlapped[1], after[1])


def test_16_bit_exchange_trains_close_to_fp32_exchange(bars, tmp_path):
    wide = _train_gpus(
        bars, tmp_path, "fp32", "--precision", "fp16", "--exchange", "fp32", "--bucket-mb", "0.0001"
    )
    narrow = _train_gpus(bars, tmp_path, "fp16", "--precision", "fp16", "--bucket-mb", "0.0001")
    assert np.isfinite(narrow[1]).all()
    assert not np.array_equal(narrow[1], wide[1])  # the 16-bit sums did round
    np.testing.assert_allclose(narrow[1], wide[1], rtol=0, atol=1e-2 * np.abs(wide[1]).max())
