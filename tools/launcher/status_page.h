// The status page `shoal run` serves at `/`: one self-contained HTML document (no external
// script, style or font: cluster machines often have no network) that polls /status.json
// every second and redraws the worker table and the loss / accuracy curves (inline SVG).
#pragma once

namespace shoal {

const char* StatusPageHtml();

}  // namespace shoal
