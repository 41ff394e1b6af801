// Checkpoint integrity and training state for bit-exact resume: a crc32c manifest
// (lathe_checkpoint.json) sealing each checkpoint dir with every file fsynced, the raw trainable
// parameters and optimizer state (training_state.bin), and resolution of resume_from_checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "core/status.h"
#include "train/optimizer.h"

namespace lathe::train {

inline constexpr const char* kCheckpointManifest = "lathe_checkpoint.json";
inline constexpr const char* kTrainingStateFile = "training_state.bin";
inline constexpr const char* kTrainingStateJson = "training_state.json";

// CRC-32C (Castagnoli), as iSCSI / ext4: Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// fsync()s a file or directory. Errors name the path.
Status FsyncPath(const std::string& path);

// Writes dir/lathe_checkpoint.json listing every regular file of dir (bytes, crc32c) after
// fsyncing each, then fsyncs the manifest and dir. The manifest's presence marks the dir complete.
// LATHE_TEST_SAVE_DELAY_MS (tests only) sleeps that long after each file, to widen the window in
// which a kill lands mid-save.
Status SealCheckpointDir(const std::string& dir, int64_t step);
// Checks the manifest and every file it lists (size and crc32c). Errors name the bad file.
Status VerifyCheckpoint(const std::string& dir);
// True when dir holds a manifest (sealed; contents not checked).
bool IsSealedCheckpoint(const std::string& dir);
// Sleeps LATHE_TEST_SAVE_DELAY_MS milliseconds when set (tests only).
void TestSaveDelay();

// resume_from_checkpoint: "last" -> the newest sealed checkpoint-N in output_dir (error when none),
// else the path itself. The result is verified (VerifyCheckpoint).
Result<std::string> ResolveResumeCheckpoint(const std::string& spec, const std::string& output_dir);

// Writes dir/training_state.bin (every trainable tensor's f32 values by name, and the optimizer's
// state: AdamW moments, BnbAdamW raw buffers) and dir/training_state.json (`scalars` plus the
// optimizer kind and step count).
Status SaveTrainingState(const std::string& dir, std::span<const ParamRef> params, Optimizer& opt,
                         const nlohmann::json& scalars);
// Restores what SaveTrainingState wrote into params (same names and sizes) and opt (the same
// kind); returns the scalars. Errors name the file and the tensor that does not match.
Result<nlohmann::json> LoadTrainingState(const std::string& dir, std::span<const ParamRef> params,
                                         Optimizer& opt);

}  // namespace lathe::train
