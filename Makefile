# kda — make builds ./kda (and the CUDA kernels when nvcc exists); make test runs every CPU test.
#   make            build ./kda
#   make test       C tests (+ ASan/UBSan build of them), Lua tests, CLI tests -> "N passed, N failed"
#   make data       the full four-domain corpus into data/ (Debian packages)
#   make data-small the small corpus CI and the CPU ladder use
#   make test-gpu   CUDA ops vs CPU, graph replay, determinism (needs a GPU)
#   make bench      GPU benchmarks against the PyTorch peers (needs a GPU)
CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
LUAJIT_INC ?= /usr/include/luajit-2.1
LUAJIT_LIB ?= /usr/lib/x86_64-linux-gnu/libluajit-5.1.a
GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -Icore -I$(LUAJIT_INC) -DKDA_GIT_REV=\"$(GIT_REV)\"
LDLIBS  = $(LUAJIT_LIB) -Wl,-Bstatic -lopenblas -ledit -Wl,-Bdynamic -lgfortran -ltinfo -lbsd -lm -ldl -lpthread
LDFLAGS += -fopenmp -Wl,-E

CORE_SRC  = $(filter-out core/main.c,$(wildcard core/*.c))
CORE_OBJ  = $(CORE_SRC:core/%.c=build/core/%.o)
CU_SRC    = $(wildcard kernels/*.cu)
ifneq ($(NVCC),)
CU_OBJ    = $(CU_SRC:kernels/%.cu=build/cuda/%.o)
NVFLAGS  ?= -O3 -std=c++17 -gencode arch=compute_90,code=[sm_90,compute_90] -Icore -Ikernels -Xcompiler -Wall
# kernels/*_wg.cu (kda_state_wg.cu, kda_mat_wg.cu, kda_rows_wg.cu, kda_final_wg.cu) use Hopper's wgmma, which exists only in the arch-specific sm_90a
WGFLAGS  ?= -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icore -Ikernels -Xcompiler -Wall
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++ -ldl
endif
TESTS     = $(patsubst tests/%.c,build/tests/%,$(wildcard tests/test_*.c))

all: kda

kda: build/core/main.o $(CORE_OBJ) $(CU_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

build/core/%.o: core/%.c $(wildcard core/*.h) | build/core
	$(CC) $(CFLAGS) -c -o $@ $<

# KFLAGS_<file>: extra nvcc options for one kernel file (e.g. KFLAGS_kda_tc_bwd="-Xptxas
# --register-usage-level=3"), the same hook as benches/kda_gpu.sh's, for trying a compiler
# setting on one file's kernels; none is set by default. A flag change alone rebuilds nothing:
# make -B the object, or build a side with benches/kda_baseline.sh (a fresh worktree)
build/cuda/%.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh core/*.h) | build/cuda
	$(NVCC) $(NVFLAGS) $(KFLAGS_$*) -c -o $@ $<
build/cuda/%_wg.o: kernels/%_wg.cu $(wildcard kernels/*.h kernels/*.cuh core/*.h) | build/cuda
	$(NVCC) $(WGFLAGS) $(KFLAGS_$*_wg) -c -o $@ $<

build/tests/%: tests/%.c $(CORE_OBJ) $(CU_OBJ) | build/tests
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

build/core build/cuda build/tests build/asan build/gpu:
	mkdir -p $@

# The C tests once more under AddressSanitizer + UndefinedBehaviorSanitizer (CPU code only).
ASAN = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
build/asan/%: tests/%.c $(CORE_SRC) | build/asan
	$(CC) $(CFLAGS) $(ASAN) -O1 $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: kda $(TESTS) $(TESTS:build/tests/%=build/asan/%)
	@bash tests/run.sh

# The GPU test and micro-benchmark binaries, linked so that they run on the H200 image
# (only libcublasLt dynamic). benches/bundle.sh packs them with ./kda for a device run.
GPU_LIBS = -Wl,-Bstatic -lopenblas -lgfortran -lquadmath -Wl,-Bdynamic /usr/lib/gcc/x86_64-linux-gnu/12/libgomp.a \
           -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart_static -lrt -lm -ldl -lpthread
build/gpu/test_cuda_ops: tests/gpu/test_cuda_ops.c $(CORE_OBJ) $(CU_OBJ) | build/gpu
	$(CC) $(CFLAGS) -c -o build/gpu/test.o $<
	g++ -static-libstdc++ -static-libgcc -o $@ build/gpu/test.o $(CORE_OBJ) $(CU_OBJ) $(GPU_LIBS)
build/gpu/cuda_ops_bench: benches/cuda_ops_bench.cu $(CORE_OBJ) $(CU_OBJ) | build/gpu
	$(NVCC) $(NVFLAGS) -c -o build/gpu/bench.o $<
	g++ -static-libstdc++ -static-libgcc -o $@ build/gpu/bench.o $(CORE_OBJ) $(CU_OBJ) $(GPU_LIBS)
gpu-bins: build/gpu/test_cuda_ops build/gpu/cuda_ops_bench

# GPU targets run on an H200.
test-gpu: kda
	sh benches/kda_gpu.sh && bash benches/cuda_gpu.sh

bench: kda gpu-bins
	bash benches/bench.sh

data:
	bash vendor/data.sh full

data-small:
	bash vendor/data.sh small

clean:
	rm -rf build kda

.PHONY: all test test-gpu bench data data-small clean gpu-bins
.SECONDARY:
