// A TrainModel stand-in for trainer tests: a unigram model (one logit per vocabulary entry, plus
// a "norm" tensor without weight decay) with exact loss and gradient, recording every batch it
// sees so tests can check collation, accumulation and normalizers without the transformer.
#pragma once

#include <cmath>
#include <fstream>
#include <vector>

#include "model/train_model.h"

namespace lathe::train::testing {

class FakeTrainModel final : public model::TrainModel {
 public:
  struct Seen {
    int64_t B, T;
    double normalizer;
    std::vector<int32_t> input_ids, labels, segment_ids;
  };
  explicit FakeTrainModel(int64_t vocab, int64_t max_seq_len = 512)
      : w_(vocab, 0.f), gw_(vocab, 0.f), n_(4, 1.f), gn_(4, 0.f) {
    config_.vocab_size = vocab;
    config_.max_seq_len = max_seq_len;
    params_.push_back({"logits.weight", {vocab}, w_.data(), gw_.data(), vocab, true});
    params_.push_back({"norm.weight", {4}, n_.data(), gn_.data(), 4, false});
  }
  const model::ModelConfig& config() const override { return config_; }
  std::span<const model::TrainableTensor> params() const override { return params_; }
  int64_t trainable_count() const override { return (int64_t)w_.size() + 4; }
  void ZeroGrad(bool hand_back_pages = true) override {
    zero_grad_hand_back.push_back(hand_back_pages);
    std::fill(gw_.begin(), gw_.end(), 0.f);
    std::fill(gn_.begin(), gn_.end(), 0.f);
  }
  Result<double> ForwardBackward(const model::TrainBatch& b, double normalizer) override {
    seen.push_back({b.B,
                    b.T,
                    normalizer,
                    {b.input_ids.begin(), b.input_ids.end()},
                    {b.labels.begin(), b.labels.end()},
                    {b.segment_ids.begin(), b.segment_ids.end()}});
    int64_t n = 0;
    double loss = Run(b, &n, normalizer, true);
    return loss;
  }
  Result<double> Loss(const model::TrainBatch& b, int64_t* n_targets) override {
    eval_calls++;
    return Run(b, n_targets, 1, false);
  }
  Result<std::unique_ptr<model::LoraAdapter>> ExportAdapter() const override {
    return Status::Error("fake model: no adapter");
  }
  Status ImportAdapter(const model::LoraAdapter&) override { return Status::Error("fake model: no adapter"); }
  Status SavePeftAdapter(const std::string& dir, const std::string& base) const override {
    saves++;
    std::ofstream(dir + "/adapter_config.json") << "{\"base_model_name_or_path\": \"" << base << "\"}\n";
    std::ofstream(dir + "/adapter_model.safetensors") << "fake " << w_[0] << "\n";
    return Status::Ok();
  }
  Status SaveHfModel(const std::string& dir, bool bf16) const override {
    saves++;
    std::ofstream(dir + "/config.json") << "{}\n";
    std::ofstream(dir + "/model.safetensors") << "fake\n";
    return Status::Ok();
  }
  std::vector<float> weights() const { return w_; }

  std::vector<Seen> seen;
  std::vector<bool> zero_grad_hand_back;  // ZeroGrad's argument per call
  int eval_calls = 0;
  mutable int saves = 0;

 private:
  // Token t predicts labels[t + 1] (HF alignment), loss = logsumexp(w) - w[label].
  double Run(const model::TrainBatch& b, int64_t* n_targets, double normalizer, bool grad) {
    double mx = -1e30;
    for (float x : w_) mx = std::max(mx, (double)x);
    double z = 0;
    for (float x : w_) z += std::exp(x - mx);
    double lse = mx + std::log(z);
    double loss = 0;
    *n_targets = 0;
    for (int64_t r = 0; r < b.B; ++r) {
      for (int64_t t = 0; t + 1 < b.T; ++t) {
        int32_t l = b.labels[r * b.T + t + 1];
        if (l == -100) continue;
        loss += lse - w_[l];
        ++*n_targets;
        if (grad) {
          for (size_t v = 0; v < w_.size(); ++v) gw_[v] += (float)(std::exp(w_[v] - lse) / normalizer);
          gw_[l] -= (float)(1.0 / normalizer);
        }
      }
    }
    return loss;
  }
  model::ModelConfig config_;
  std::vector<float> w_, gw_, n_, gn_;
  std::vector<model::TrainableTensor> params_;
};

}  // namespace lathe::train::testing
