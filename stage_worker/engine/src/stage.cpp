#include "conveyor/engine/stage.hpp"

#include <string>

namespace conveyor::engine {

stage_range whole_model(const model_config& config) {
  return stage_range{0, config.num_layers, true, true};
}

result<std::vector<stage_range>> split_explicit(const model_config& config,
                                                const std::vector<int>& layers_per_stage) {
  if (layers_per_stage.empty()) return make_error(errc::invalid_argument, "a model needs at least one stage");
  std::vector<stage_range> out;
  int first = 0;
  for (std::size_t i = 0; i < layers_per_stage.size(); ++i) {
    if (layers_per_stage[i] <= 0) {
      return make_error(errc::invalid_argument, "stage " + std::to_string(i) + " must own at least one layer");
    }
    out.push_back(stage_range{first, first + layers_per_stage[i], i == 0, i + 1 == layers_per_stage.size()});
    first += layers_per_stage[i];
  }
  if (first != config.num_layers) {
    return make_error(errc::invalid_argument, "the stages own " + std::to_string(first) +
                                                  " layers but the model has " + std::to_string(config.num_layers));
  }
  return out;
}

result<std::vector<stage_range>> split_even(const model_config& config, int stages) {
  if (stages < 1 || stages > config.num_layers) {
    return make_error(errc::invalid_argument, "stages must be between 1 and the model's " +
                                                  std::to_string(config.num_layers) + " layers, got " +
                                                  std::to_string(stages));
  }
  std::vector<int> counts(stages, config.num_layers / stages);
  for (int i = 0; i < config.num_layers % stages; ++i) ++counts[i];
  return split_explicit(config, counts);
}

}  // namespace conveyor::engine
