"""GPU kernels are classified by their own name, from a table users can extend.

The kernel names here are real: copied from the PyTorch profiler traces in
HolisticTraceAnalysis's tests/data (../shared/data/traces/hta; A100, V100, MI250).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from paraplan.specs import ConfigError
from paraplan.traces import kernels
from paraplan.traces.kernels import (
    KernelName,
    classify_kernel,
    kernel_name,
    kernel_precision,
    kernel_table,
    load_kernel_table,
)
from paraplan.traces.rules import COMPUTE_CLASSES, classify

HTA = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "hta"

#: (real kernel signature, its class): at least one for every rule of the built-in table.
REAL_KERNELS = [
    # conv
    ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "conv"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, "
     "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, "
     "int, int, int)", "conv"),
    ("void cudnn::cnn::reduce_wgrad_nchw_helper<float, float>(void*, void const*, float, int, int)", "conv"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_warpsize2x2x1_g1_"
     "tensor16x8x8_execute_kernel_trt", "conv"),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemm"
     "MultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEEEEEEEEvNT_6ParamsE", "conv"),
    ("void cutlass_cudnn_train::Kernel<cutlass_cudnn_train::reduction::kernel::ReduceSplitK<cutlass_cudnn_train"
     "::MatrixShape<4, 128>, cutlass_cudnn_train::epilogue::thread::LinearCombination<float, 4, float, float, "
     "(cutlass_cudnn_train::epilogue::thread::ScaleType::Kind)0> > >(cutlass_cudnn_train::reduction::kernel::"
     "ReduceSplitK<>::Params)", "conv"),
    # gemm
    ("volta_sgemm_128x32_nt", "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>"
     "(cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1::Params)", "gemm"),
    ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1", "gemm"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams"
     "<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, "
     "float*, void*, long, float*, int*)", "gemm"),
    ("void scal_kernel<float, float, 1, false, 6, 5, 5, 3>(cublasTransposeParams<float>, float const*, float*, "
     "float const*)", "gemm"),
    ("void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, float*, "
     "cublasLtEpilogue_t, int, float*, long, void*, long, long, long, float*, long, int*)", "gemm"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, "
     "true, false, false, 7, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
     "(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float "
     "const>, cublasGemvTensorStridedBatched<float>, float>)", "gemm"),
    # gemm kernels of recent GPUs (not in these traces): FP8, CUTLASS 3 (grouped GEMMs), split-K
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "gemm"),
    ("nvjet_qqtst_128x256_64x4_2x1_v_bz_coopA_NTN", "gemm"),
    ("triton_tem_fused_addmm_0", "gemm"),
    ("void cutlass::reduction::kernel::ReduceSplitK<cutlass::MatrixShape<4, 128> >(cutlass::reduction::"
     "kernel::ReduceSplitK<>::Params)", "gemm"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
     "cutlass::gemm::collective::CollectiveMma<> > >(cutlass::gemm::kernel::GemmUniversal<>::Params)", "gemm"),
    # attention (not in these traces: FlashAttention 2 and 3, PyTorch's mem-efficient attention)
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >"
     "(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloop"
     "FwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> > > > > >(flash::enable_sm90_or_later<>::Params)",
     "attention"),
    # norm
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float "
     "const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, "
     "float*, float, float)", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float "
     "const*, float const*, float const*, float*, float*, float*)", "norm"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, float "
     "const*, float const*, float const*, float const*, float*, float*)", "norm"),
    # fp8 casts
    ("void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*, float "
     "const*, int, int, unsigned char*, bool)", "fp8_cast"),
    ("void transformer_engine::detail::cast_transpose_kernel<8, true, float, __nv_fp8_e4m3>(CTParams)", "fp8_cast"),
    # embedding
    ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, "
     "32ul>(at::GenericPackedTensorAccessor<c10::Half, 1ul, at::RestrictPtrTraits, long>)", "embedding"),
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int, int, int, int const*, "
     "decltype(nullptr) const*, int const*, int const*, int const*, int*, decltype(nullptr)*)", "embedding"),
    # optimizer
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, "
     "float, float, adamMode_t, float, int, int>(int, int volatile*, TensorListMetadata<4>, AdamFunctor<float>, "
     "float, float, float, float, float, float, adamMode_t, float)", "optimizer"),
    # elementwise
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array"
     "<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", "elementwise"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800, false, "
     "long, int, int, int>(int*, int*, int*, int const*, long*, long const*, int*, int const*, int, int, int)",
     "elementwise"),
    ("void cub::DeviceCompactInitKernel<cub::ReduceByKeyScanTileState<int, int, true>, int*>(cub::ReduceByKey"
     "ScanTileState<int, int, true>, int, int*)", "elementwise"),
]


@pytest.mark.parametrize(("signature", "klass"), REAL_KERNELS)
def test_a_real_kernel_is_classified_by_its_own_name(signature, klass):
    assert classify(signature, "kernel").klass == klass


def test_every_rule_of_the_table_classifies_at_least_one_real_kernel():
    table = kernel_table()
    used = set()
    for signature, _ in REAL_KERNELS:
        kernel = kernel_name(signature)
        used.add(next(i for i, rule in enumerate(table.rules) if rule.matches(kernel)))
    assert used == set(range(len(table.rules)))


@pytest.mark.parametrize(("signature", "namespace", "name"), [
    ("void at::native::(anonymous namespace)::foo<float, 4>(float*, int)", "at::native", "foo"),
    ("volta_sgemm_128x32_nt", "", "volta_sgemm_128x32_nt"),
    ("void my_kernel<float>(float*) [clone .kd]", "", "my_kernel"),
    ("split_embedding_backward_codegen_rowwise_adagrad_weighted_find_long_segments(at::GenericPackedTensor"
     "Accessor<int, 1ul, at::RestrictPtrTraits, int>)", "", "split_embedding_backward_codegen_rowwise_adagrad_"
     "weighted_find_long_segments"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar("
     "at::TensorIteratorBase&, c10::Scalar)::{lambda()#1}::operator()() const::{lambda(float)#1}, "
     "at::detail::Array<char*, 2> >(int)", "at::native", "vectorized_elementwise_kernel"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::"
     "nchw2nhwc_params_t<float>, float const*, float*)", "cudnn::ops", "nchwToNhwcKernel"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4>(cutlass_80_tensorop_s1688gemm_"
     "64x64_32x4_nt_align4::Params)", "cutlass", "cutlass_80_tensorop_s1688gemm_64x64_32x4_nt_align4"),
    ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, float>(cublasGemvParams<float>)",
     "internal::gemvx", "kernel"),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionIvEEEEvNT_6ParamsE",
     "cutlass_cudnn_train::conv::kernel", "ImplicitGemmConvolution"),
])
def test_a_kernels_own_name_drops_return_type_template_arguments_and_parameters(signature, namespace, name):
    assert kernel_name(signature) == KernelName(namespace, name)


def test_template_arguments_naming_a_library_do_not_make_an_elementwise_kernel_a_gemm():
    sig = ("void at::native::vectorized_elementwise_kernel<4, cutlass_gemm_functor<float>, at::detail::Array"
           "<char*, 3> >(int, cublasGemmParams)")
    assert classify_kernel(sig) == "elementwise"


def test_an_fp8_gemm_is_a_gemm_and_an_fp8_cast_is_a_cast():
    assert classify_kernel("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x64_cublas") == "gemm"
    assert classify_kernel("void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_cuda_kernel<float>"
                           "(unsigned char const*, int, int, float*, bool)") == "fp8_cast"


def test_memory_copies_and_sets_are_memory_not_compute():
    assert classify("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy").klass == "memory"
    assert classify("Memset (Device)", "gpu_memset").klass == "memory"
    assert "memory" in COMPUTE_CLASSES


def test_communication_kernels_stay_communication():
    verdict = classify("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "kernel")
    assert verdict.klass == "comm" and verdict.collective == "all_reduce"


def test_a_kernel_no_rule_names_is_left_to_other():
    assert classify("void my_own_thing_kernel<float>(float*)", "kernel").klass is None


def test_the_unclassified_kernels_are_listed_by_their_own_name_most_time_first():
    seconds = {"void my_thing<float>(float*)": 1.0, "void my_thing<int>(int*)": 2.0,
               "void ns::rare_kernel<2>(int)": 0.5, "volta_sgemm_128x32_nt": 9.0}
    assert kernels.top_unclassified(seconds) == [("my_thing", 3.0), ("ns::rare_kernel", 0.5)]
    assert kernels.top_unclassified(seconds, limit=1) == [("my_thing", 3.0)]


def test_nccl_kernels_of_the_2021_schema_are_communication():
    assert classify("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "Kernel").klass == "comm"


def test_a_users_table_is_tried_before_the_built_in_one(tmp_path, monkeypatch):
    path = tmp_path / "mine.yaml"
    path.write_text("rules:\n  - {class: attention, name: '^my_own_thing'}\n  - {class: norm, name: 'sgemm'}\n")
    monkeypatch.setenv(kernels.USER_TABLE_ENV, str(path))
    kernel_table.cache_clear()
    try:
        assert classify_kernel("void my_own_thing_kernel<float>(float*)") == "attention"
        assert classify_kernel("volta_sgemm_128x32_nt") == "norm"
        assert classify_kernel("void cub::DeviceScanInitKernel<int>(int)") == "elementwise"
    finally:
        monkeypatch.delenv(kernels.USER_TABLE_ENV)
        kernel_table.cache_clear()


@pytest.mark.parametrize(("signature", "precision"), [
    # HTA's A100 traces (A, E1): cuBLAS's CUTLASS fp32 tensor-op GEMMs, m16n8k8 = the TF32 MMA
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"
     "(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)", "tf32"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", "tf32"),
    ("cutlass_tensorop_s1688gemm_3xtf32_fast_f32_128x128_16x4_nn_align4", "fp32"),  # fp32-accurate 3xTF32
    ("ampere_sgemm_128x64_nn", None),  # SIMT fp32: the job's precision
    ("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", None),
])
def test_a_gemm_kernels_own_name_says_when_it_runs_on_tf32_tensor_cores(signature, precision):
    assert kernel_precision(signature) == precision


@pytest.mark.parametrize(("text", "field"), [
    ("precisions:\n  - {precision: tf33, name: x}\n", "precisions[0].precision"),
    ("precisions: 3\n", "precisions"),
    ("rules:\n  - {class: gemmm, name: x}\n", "rules[0].class"),
    ("rules:\n  - {class: gemm, name: '('}\n", "rules[0]"),
    ("rules:\n  - {class: gemm}\n", "rules[0]"),
    ("rules: 3\n", "rules"),
])
def test_a_wrong_users_table_is_refused_in_one_line_naming_the_entry(text, field):
    with pytest.raises(ConfigError) as err:
        load_kernel_table(text, "mine.yaml")
    assert field in str(err.value) and "\n" not in str(err.value)


#: Share of kernel time left "other" on each HTA set, measured 2026-11-26: 0.0 % on all seven.
OTHER_SHARE_BOUND = 0.005


@pytest.mark.shared_data
@pytest.mark.parametrize("folder", ["A_vit128_sampled", "B_resnet_nccl_a100", "C_dfindex_v100",
                                    "E1_diff_control_a100x8", "F_ns_resolution_v100", "I_amd_mi250",
                                    "J_gpu_user_annotation"])
def test_little_kernel_time_is_left_other_on_the_real_traces(folder):
    files = sorted((HTA / folder).glob("*.json.gz"))
    if not files:
        pytest.skip(f"../shared/data/traces/hta/{folder} is not present")
    time: Counter = Counter()
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
        for ev in events:
            if ev.get("ph") == "X" and ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                time[classify(ev.get("name", ""), ev["cat"]).klass or "other"] += float(ev.get("dur", 0))
    assert time["other"] / sum(time.values()) < OTHER_SHARE_BOUND
