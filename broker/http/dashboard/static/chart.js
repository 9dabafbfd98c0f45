// A line chart on a canvas for the overview's message rates: the last `points` samples of
// a few series, scaled to the largest value shown. Hand-drawn rather than a chart library:
// nothing else is needed and every asset must come from the broker.

export class LineChart {
  constructor(canvas, series, points = 120) {
    this.canvas = canvas;
    this.series = series;  // [{label, color}]
    this.points = points;
    this.values = series.map(() => []);
  }

  push(sample) {
    sample.forEach((value, i) => {
      const list = this.values[i];
      list.push(value);
      if (list.length > this.points) list.shift();
    });
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    if (!width || !height) return;  // on a hidden view: drawn when shown
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.clearRect(0, 0, width, height);
    const top = Math.max(1, ...this.values.flat());
    const left = 8, bottom = height - 18, plot = width - left - 8;
    ctx.font = "12px sans-serif";
    ctx.fillStyle = "#667";
    ctx.fillText(`${formatRate(top)}/s`, left, 12);
    ctx.strokeStyle = "#dde";
    ctx.beginPath();
    ctx.moveTo(left, bottom);
    ctx.lineTo(width - 8, bottom);
    ctx.stroke();
    this.series.forEach(({ label, color }, i) => {
      const list = this.values[i];
      ctx.strokeStyle = color;
      ctx.lineWidth = i === 0 ? 3 : 1.5;  // the first under the others: equal rates stay visible
      ctx.beginPath();
      list.forEach((value, j) => {
        const x = left + plot * (j + this.points - list.length) / (this.points - 1);
        const y = bottom - (bottom - 18) * value / top;
        if (j === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
      ctx.fillStyle = color;
      const last = list.length ? list[list.length - 1] : 0;
      ctx.fillText(`${label} ${formatRate(last)}/s`, left + i * 140, height - 4);
    });
  }
}

export function formatRate(value) {
  return value >= 1000 ? `${(value / 1000).toFixed(1)}k` : value.toFixed(value < 10 ? 1 : 0);
}
