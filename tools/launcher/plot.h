// A PNG plot of a job's loss and test accuracy against wall time (no plotting library:
// a small rasterizer, a 5x7 font for the labels, zlib for the PNG stream).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace shoal {

struct PlotSeries {
  std::string title;                              // e.g. "loss"
  std::vector<std::pair<double, double>> points;  // (wall_s, value)
};

// Writes side-by-side panels, one per series; throws shoal::Error naming the path.
void WritePlotPng(const std::string& path, const std::vector<PlotSeries>& panels);

}  // namespace shoal
